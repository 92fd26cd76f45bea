// Kroxylicious (io.kroxylicious:kroxylicious-runtime) as a process of its own: the benchmark's peer proxy.
//
// Kroxylicious's own command line (kroxylicious-app) is not on Maven Central, so this is the least that
// starts the runtime from a YAML file: parse it, build the proxy with the default feature set, start it,
// block until it is shut down. No filters beyond the ones the runtime always installs.
//   java -cp <this class>:<kroxylicious-runtime jars> KroxyliciousLauncher CONFIG.yaml
// Prints "STARTED" on stdout once every gateway is bound; SIGTERM shuts it down (a JVM shutdown hook).
import java.io.InputStream;
import java.nio.file.Files;
import java.nio.file.Path;

import io.kroxylicious.proxy.KafkaProxy;
import io.kroxylicious.proxy.config.ConfigParser;
import io.kroxylicious.proxy.config.Configuration;
import io.kroxylicious.proxy.internal.config.Features;

public final class KroxyliciousLauncher {
    public static void main(String[] args) throws Exception {
        if (args.length != 1) {
            System.err.println("usage: KroxyliciousLauncher CONFIG.yaml");
            System.exit(2);
        }
        ConfigParser parser = new ConfigParser();
        Configuration config;
        try (InputStream in = Files.newInputStream(Path.of(args[0]))) {
            config = parser.parseConfiguration(in);
        }
        KafkaProxy proxy = new KafkaProxy(parser, config, Features.defaultFeatures());
        proxy.startup();
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            try {
                proxy.close();
            } catch (Exception e) {
                e.printStackTrace();
            }
        }, "kroxylicious-launcher-shutdown"));
        System.out.println("STARTED");
        System.out.flush();
        proxy.block();
    }
}
