package strata.it;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.Config;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.admin.DescribeConfigsOptions;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.errors.InvalidRequestException;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/**
 * Dynamic broker configs (KIP-226) through Kafka's own kafka-configs and the Java Admin client, on a private
 * broker (node 1): per broker and as the cluster default, described with Kafka's sources and synonyms,
 * deleted, refused for a read-only config, and still there after the broker restarts; and a group's configs.
 */
@Timeout(value = 300, unit = TimeUnit.SECONDS)
class BrokerConfigsCliTest {
  static final String CONFIGS = "org.apache.kafka.tools.ConfigCommand";

  static GroupSupport.StrataProcess broker;

  @BeforeAll
  static void start() throws Exception {
    broker = new GroupSupport.StrataProcess(List.of("--max-connections-per-ip", "1000"));
    broker.start();
  }

  @AfterAll
  static void stop() throws Exception {
    if (broker != null) broker.close();
  }

  static CliToolsTest.Result cli(String... args) throws Exception {
    String[] all = new String[args.length + 2];
    all[0] = "--bootstrap-server";
    all[1] = broker.bootstrap();
    System.arraycopy(args, 0, all, 2, args.length);
    return CliToolsTest.run(null, CONFIGS, all);
  }

  static Admin admin() {
    Properties p = new Properties();
    p.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, broker.bootstrap());
    return Admin.create(p);
  }

  static ConfigEntry entry(Admin admin, String resource, String name) throws Exception {
    ConfigResource r = new ConfigResource(ConfigResource.Type.BROKER, resource);
    Map<ConfigResource, Config> all = admin.describeConfigs(List.of(r), new DescribeConfigsOptions().includeSynonyms(true))
        .all().get(30, TimeUnit.SECONDS);
    return all.get(r).get(name);
  }

  @Test
  void kafkaConfigsSetsDescribesAndDeletesPerBrokerAndDefaultConfigsWhichSurviveARestart() throws Exception {
    var perBroker = cli("--entity-type", "brokers", "--entity-name", "1", "--alter", "--add-config",
        "max.connections.per.ip=40");
    assertEquals(0, perBroker.exit(), perBroker.toString());
    assertTrue(perBroker.out().contains("Completed updating config for broker 1."), perBroker.toString());
    var byDefault = cli("--entity-type", "brokers", "--entity-default", "--alter", "--add-config",
        "max.connections=900,max.connections.per.ip=30");
    assertEquals(0, byDefault.exit(), byDefault.toString());
    assertTrue(byDefault.out().contains("Completed updating default config for brokers in the cluster."),
        byDefault.toString());

    var described = cli("--entity-type", "brokers", "--entity-name", "1", "--describe");
    assertEquals(0, described.exit(), described.toString());
    assertTrue(described.out().contains("Dynamic configs for broker 1 are:"), described.toString());
    assertTrue(described.out().contains("max.connections.per.ip=40 sensitive=false synonyms={"
        + "DYNAMIC_BROKER_CONFIG:max.connections.per.ip=40, DYNAMIC_DEFAULT_BROKER_CONFIG:max.connections.per.ip=30, "
        + "STATIC_BROKER_CONFIG:max.connections.per.ip=1000}"), described.toString());
    var defaults = cli("--entity-type", "brokers", "--entity-default", "--describe");
    assertEquals(0, defaults.exit(), defaults.toString());
    assertTrue(defaults.out().contains("Default configs for brokers in the cluster are:"), defaults.toString());
    assertTrue(defaults.out().contains(
        "max.connections=900 sensitive=false synonyms={DYNAMIC_DEFAULT_BROKER_CONFIG:max.connections=900}"),
        defaults.toString());

    try (Admin admin = admin()) {
      ConfigEntry max = entry(admin, "1", "max.connections");
      assertEquals("900", max.value());
      assertEquals(ConfigEntry.ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG, max.source());
      assertFalse(max.isReadOnly());
      ConfigEntry partitions = entry(admin, "1", "num.partitions");
      assertTrue(partitions.isReadOnly());
      assertEquals(ConfigEntry.ConfigSource.STATIC_BROKER_CONFIG, partitions.source());
      // The Admin API refuses a read-only config with Kafka's InvalidRequestException.
      var ro = new AlterConfigOp(new ConfigEntry("num.partitions", "3"), AlterConfigOp.OpType.SET);
      var e = assertThrows(ExecutionException.class, () -> admin.incrementalAlterConfigs(
          Map.of(new ConfigResource(ConfigResource.Type.BROKER, "1"), List.of(ro))).all().get(30, TimeUnit.SECONDS));
      assertInstanceOf(InvalidRequestException.class, e.getCause());
      assertTrue(e.getCause().getMessage().contains("Cannot update these configs dynamically"), e.toString());
    }
    var readOnly = cli("--entity-type", "brokers", "--entity-name", "1", "--alter", "--add-config",
        "num.partitions=3");
    assertNotEquals(0, readOnly.exit(), readOnly.toString());

    var deleted = cli("--entity-type", "brokers", "--entity-name", "1", "--alter", "--delete-config",
        "max.connections.per.ip");
    assertEquals(0, deleted.exit(), deleted.toString());

    // Stored: a restarted broker has them back.
    broker.process.destroy();
    assertTrue(broker.process.waitFor(20, TimeUnit.SECONDS));
    broker.start();
    try (Admin admin = admin()) {
      ConfigEntry perIp = entry(admin, "1", "max.connections.per.ip");
      assertEquals("30", perIp.value(), perIp.toString());
      assertEquals(ConfigEntry.ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG, perIp.source());
      assertEquals(List.of(ConfigEntry.ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG,
              ConfigEntry.ConfigSource.STATIC_BROKER_CONFIG),
          perIp.synonyms().stream().map(ConfigEntry.ConfigSynonym::source).toList());
    }
    var after = cli("--entity-type", "brokers", "--entity-name", "1", "--describe");
    assertEquals(0, after.exit(), after.toString());
    assertFalse(after.out().contains("DYNAMIC_BROKER_CONFIG:max.connections.per.ip"), after.toString());
  }

  @Test
  void kafkaConfigsSetsAndDescribesAGroupsConfigsAndRefusesABadOne() throws Exception {
    var set = cli("--entity-type", "groups", "--entity-name", "cli-orders", "--alter", "--add-config",
        "consumer.heartbeat.interval.ms=7000");
    assertEquals(0, set.exit(), set.toString());
    var described = cli("--entity-type", "groups", "--entity-name", "cli-orders", "--describe");
    assertEquals(0, described.exit(), described.toString());
    assertTrue(described.out().contains("consumer.heartbeat.interval.ms=7000 sensitive=false synonyms={"
        + "DYNAMIC_GROUP_CONFIG:consumer.heartbeat.interval.ms=7000, "
        + "STATIC_BROKER_CONFIG:group.consumer.heartbeat.interval.ms=5000}"), described.toString());
    var outOfRange = cli("--entity-type", "groups", "--entity-name", "cli-orders", "--alter", "--add-config",
        "consumer.session.timeout.ms=1000");
    assertNotEquals(0, outOfRange.exit(), outOfRange.toString());
    assertTrue(outOfRange.toString().contains("must be in the range 45000 to 60000"), outOfRange.toString());
  }
}
