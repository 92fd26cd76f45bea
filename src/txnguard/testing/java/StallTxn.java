// A transactional producer that outlives its transaction.timeout.ms (KIP-588 experiments).
//
// Run with the JDK's source launcher and a Kafka tools classpath:
//   java -cp <kafka-tools jars> StallTxn.java BOOTSTRAP TOPIC TXN_ID TIMEOUT_MS STALL_MS MODE
// MODE is "send" (after the stall: send one more record, then commit) or "commit" (commit at once).
// The program begins a transaction, writes one record, sleeps STALL_MS (the coordinator aborts the
// transaction once it is older than TIMEOUT_MS), then does MODE. On an error it does what an
// application should: abort when the error is abortable, give up when it is fatal. After a
// successful abort it runs one more transaction to see whether the producer recovered.
// Every step prints one line "STEP <name> ok" or "STEP <name> error <ExceptionClass> <message>";
// the last line is "RESULT committed|recovered|fatal|unrecovered".
import java.util.Properties;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.errors.AuthorizationException;
import org.apache.kafka.common.errors.OutOfOrderSequenceException;
import org.apache.kafka.common.errors.ProducerFencedException;
import org.apache.kafka.common.serialization.StringSerializer;

public class StallTxn {
    interface Step { void run() throws Exception; }

    static Throwable step(String name, Step s) {
        try {
            s.run();
            System.out.println("STEP " + name + " ok");
            return null;
        } catch (Exception e) {
            Throwable t = e;
            while (t.getCause() != null && (t instanceof java.util.concurrent.ExecutionException)) t = t.getCause();
            System.out.println("STEP " + name + " error " + t.getClass().getSimpleName() + " " + t.getMessage());
            return t;
        }
    }

    static boolean fatal(Throwable t) {
        return t instanceof ProducerFencedException || t instanceof OutOfOrderSequenceException
            || t instanceof AuthorizationException || (t instanceof IllegalStateException);
    }

    public static void main(String[] a) throws Exception {
        String bootstrap = a[0], topic = a[1], txnId = a[2], mode = a[5];
        long stallMs = Long.parseLong(a[4]);
        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("transactional.id", txnId);
        p.put("transaction.timeout.ms", a[3]);
        p.put("max.block.ms", "20000");
        p.put("request.timeout.ms", "10000");
        p.put("delivery.timeout.ms", "20000");
        p.put("key.serializer", StringSerializer.class.getName());
        p.put("value.serializer", StringSerializer.class.getName());
        String result;
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(p)) {
            producer.initTransactions();
            producer.beginTransaction();
            producer.send(new ProducerRecord<>(topic, 0, null, "before-stall")).get();
            System.out.println("STEP first-send ok");
            Thread.sleep(stallMs);
            Throwable err = null;
            if (mode.equals("send")) {
                err = step("send-after-stall", () -> producer.send(new ProducerRecord<>(topic, 0, null, "after-stall")).get());
            }
            if (err == null) {
                err = step("commit", producer::commitTransaction);
                if (err == null) { System.out.println("RESULT committed"); return; }
            }
            if (fatal(err)) { System.out.println("RESULT fatal"); return; }
            err = step("abort", producer::abortTransaction);
            if (err != null) { System.out.println(fatal(err) ? "RESULT fatal" : "RESULT unrecovered"); return; }
            err = step("next-transaction", () -> {
                producer.beginTransaction();
                producer.send(new ProducerRecord<>(topic, 0, null, "recovered")).get();
                producer.commitTransaction();
            });
            result = err == null ? "recovered" : (fatal(err) ? "fatal" : "unrecovered");
            System.out.println("RESULT " + result);
        }
    }
}
