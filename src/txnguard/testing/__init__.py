"""Real parts for tests, benchmarks and demos: Kafka clusters from Maven Central jars,
real client adapters, and a raw protocol client. Never imported by the product."""
