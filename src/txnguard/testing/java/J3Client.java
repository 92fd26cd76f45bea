// J3 (KAFKA-17754) driven by the real Java client: two transactions of one producer, each step on a
// signal from the test (stdin), each result as one JSON line (stdout). Compiled by
// txnguard.testing.kafka_17754 against the kafka-clients of the version under test; ours, not Kafka's.
//
//   T1: send t1 -> p0; wait "commit"; commitTransaction()     (the test holds that EndTxn in the relay)
//   T2: send t2-a -> p0, t2-b -> p1 (both partitions added);   wait "go"; send t2-c -> p0; commit
//       (the test releases T1's held EndTxn in between)
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.util.Properties;
import java.util.concurrent.Future;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;

public class J3Client {
    static void say(String step, String result) {
        System.out.println("{\"step\":\"" + step + "\",\"result\":\"" + result.replace("\"", "'").replace("\n", " ")
                + "\"}");
        System.out.flush();
    }

    static String send(KafkaProducer<byte[], byte[]> p, String topic, int partition, String value) {
        try {
            p.send(new ProducerRecord<>(topic, partition, null, value.getBytes())).get();
            return "ok";
        } catch (Exception e) {
            return "error: " + (e.getCause() != null ? e.getCause() : e);
        }
    }

    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], topic = args[1], transactionalId = args[2], requestTimeoutMs = args[3];
        Properties props = new Properties();
        props.put("bootstrap.servers", bootstrap);
        props.put("transactional.id", transactionalId);
        props.put("request.timeout.ms", requestTimeoutMs);
        props.put("delivery.timeout.ms", "60000");
        props.put("max.block.ms", "60000");
        props.put("linger.ms", "0");
        props.put("key.serializer", "org.apache.kafka.common.serialization.ByteArraySerializer");
        props.put("value.serializer", "org.apache.kafka.common.serialization.ByteArraySerializer");
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        try (KafkaProducer<byte[], byte[]> p = new KafkaProducer<>(props)) {
            p.initTransactions();
            p.beginTransaction();
            say("t1_sent", send(p, topic, 0, "t1"));
            in.readLine();
            try {
                p.commitTransaction();
                say("t1_end", "committed");
            } catch (Exception e) {
                say("t1_end", "error: " + e);
                return;
            }
            p.beginTransaction();
            Future<RecordMetadata> a = p.send(new ProducerRecord<>(topic, 0, null, "t2-a".getBytes()));
            Future<RecordMetadata> b = p.send(new ProducerRecord<>(topic, 1, null, "t2-b".getBytes()));
            say("t2_begun", "ok");
            String written = "ok";
            try {
                a.get();
                b.get();
            } catch (Exception e) {
                written = "error: " + (e.getCause() != null ? e.getCause() : e);
            }
            say("t2_open", written);
            in.readLine();
            String c = written.equals("ok") ? send(p, topic, 0, "t2-c") : "skipped";
            say("t2_c", c);
            if (written.equals("ok") && c.equals("ok")) {
                try {
                    p.commitTransaction();
                    say("t2_end", "committed");
                    return;
                } catch (Exception e) {
                    say("t2_commit_error", e.toString());
                }
            }
            try {
                p.abortTransaction();
                say("t2_end", "aborted");
            } catch (Exception e) {
                say("t2_end", "unknown: abort failed: " + e);
            }
        }
    }
}
