// A short-transaction loop for the Java client (issue 11, KIP-609 absorption): one record to one
// partition per transaction, as fast as the client goes. Run with Java's single-file launcher and a
// kafka-clients classpath (src/txnguard/testing/short_transactions.py does):
//   java -cp <kafka-tools jars> ShortTransactions.java BOOTSTRAP TOPIC TRANSACTIONAL_ID TRANSACTIONS
// Prints one JSON line: {"transactions": N, "seconds": S}. Any client error is fatal (exit 1).
import java.util.Properties;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class ShortTransactions {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        props.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, args[2]);
        props.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        props.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        String topic = args[1];
        int transactions = Integer.parseInt(args[3]);
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(props)) {
            producer.initTransactions();
            long start = System.nanoTime();
            for (int i = 0; i < transactions; i++) {
                producer.beginTransaction();
                producer.send(new ProducerRecord<>(topic, 0, null, ("v" + i).getBytes()));
                producer.commitTransaction();
            }
            double seconds = (System.nanoTime() - start) / 1e9;
            System.out.println("{\"transactions\": " + transactions + ", \"seconds\": " + seconds + "}");
        }
    }
}
