// Delegation tokens with the Java client's AdminClient, then a producer and a consumer that
// authenticate with the token over SCRAM (tokenauth=true). Run by run.sh as a single-file program:
//
//   java -cp "<kafka-clients and its dependencies>" DelegationTokens.java \
//       SASL_SSL_BOOTSTRAP PLAINTEXT_BOOTSTRAP CA_PEM
//
// Prints one line per step and exits non-zero at the first that fails.

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import java.util.UUID;
import java.util.concurrent.ExecutionException;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.CreateDelegationTokenOptions;
import org.apache.kafka.clients.admin.ExpireDelegationTokenOptions;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.RenewDelegationTokenOptions;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.DelegationTokenNotFoundException;
import org.apache.kafka.common.errors.DelegationTokenOwnerMismatchException;
import org.apache.kafka.common.errors.SaslAuthenticationException;
import org.apache.kafka.common.errors.UnsupportedByAuthenticationException;
import org.apache.kafka.common.security.auth.KafkaPrincipal;
import org.apache.kafka.common.security.token.delegation.DelegationToken;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;
import org.apache.kafka.common.utils.internals.AppInfoParser;

public class DelegationTokens {
    static String saslSsl;
    static String plaintext;
    static String caPem;

    static Properties scram(String user, String password, boolean token) {
        Properties p = new Properties();
        p.put("bootstrap.servers", saslSsl);
        p.put("security.protocol", "SASL_SSL");
        p.put("sasl.mechanism", "SCRAM-SHA-512");
        p.put("sasl.jaas.config", "org.apache.kafka.common.security.scram.ScramLoginModule required username=\""
                + user + "\" password=\"" + password + "\"" + (token ? " tokenauth=\"true\"" : "") + ";");
        p.put("ssl.truststore.type", "PEM");
        p.put("ssl.truststore.location", caPem);
        p.put("default.api.timeout.ms", "15000");
        p.put("request.timeout.ms", "10000");
        return p;
    }

    static void check(boolean ok, String what) {
        if (!ok) {
            throw new AssertionError(what);
        }
        System.out.println("ok   " + what);
    }

    /** The cause of the failure of `call`, which must fail. */
    static Throwable failure(java.util.concurrent.Callable<?> call) throws Exception {
        try {
            call.call();
        } catch (ExecutionException e) {
            return e.getCause();
        } catch (RuntimeException e) {
            return e;
        }
        throw new AssertionError("expected a failure");
    }

    public static void main(String[] args) throws Exception {
        saslSsl = args[0];
        plaintext = args[1];
        caPem = args[2];
        System.out.println("kafka-clients " + AppInfoParser.getVersion());
        KafkaPrincipal alice = new KafkaPrincipal("User", "alice");
        try (Admin admin = Admin.create(scram("admin", "admin-secret", false))) {
            DelegationToken token = admin.createDelegationToken(new CreateDelegationTokenOptions()
                    .renewers(List.of(alice)).maxLifetimeMs(3_600_000)).delegationToken().get();
            var info = token.tokenInfo();
            check(info.owner().equals(new KafkaPrincipal("User", "admin")), "created, owned by admin: " + info.tokenId());
            check(info.renewers().equals(List.of(alice)), "alice is its renewer");
            check(info.maxTimestamp() - info.issueTimestamp() == 3_600_000, "max lifetime as asked (1 h)");
            check(token.hmac().length == 64, "HMAC-SHA512");

            List<DelegationToken> described = admin.describeDelegationToken().delegationTokens().get();
            check(described.stream().anyMatch(t -> t.tokenInfo().tokenId().equals(info.tokenId())
                    && java.util.Arrays.equals(t.hmac(), token.hmac())), "describeDelegationToken lists it with its HMAC");

            long expiry = admin.renewDelegationToken(token.hmac(),
                    new RenewDelegationTokenOptions().renewTimePeriodMs(600_000)).expiryTimestamp().get();
            check(expiry > System.currentTimeMillis() && expiry <= info.maxTimestamp(), "renewed until " + expiry);

            // A producer and a consumer on the token act as admin.
            String topic = "dt-" + UUID.randomUUID().toString().substring(0, 8);
            admin.createTopics(List.of(new NewTopic(topic, 1, (short) 1))).all().get();
            Properties byToken = scram(info.tokenId(), token.hmacAsBase64String(), true);
            Properties producerProps = new Properties();
            producerProps.putAll(byToken);
            producerProps.put("key.serializer", StringSerializer.class.getName());
            producerProps.put("value.serializer", StringSerializer.class.getName());
            try (KafkaProducer<String, String> producer = new KafkaProducer<>(producerProps)) {
                for (int i = 0; i < 5; i++) {
                    producer.send(new ProducerRecord<>(topic, 0, null, "v" + i)).get();
                }
            }
            check(true, "producer authenticated with the token wrote 5 records");
            Properties consumerProps = new Properties();
            consumerProps.putAll(byToken);
            consumerProps.put("key.deserializer", StringDeserializer.class.getName());
            consumerProps.put("value.deserializer", StringDeserializer.class.getName());
            consumerProps.put("group.id", "dt-group-" + topic);
            consumerProps.put("auto.offset.reset", "earliest");
            List<String> got = new ArrayList<>();
            try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(consumerProps)) {
                consumer.subscribe(List.of(topic));
                long deadline = System.currentTimeMillis() + 30_000;
                while (got.size() < 5 && System.currentTimeMillis() < deadline) {
                    for (ConsumerRecord<String, String> r : consumer.poll(Duration.ofMillis(500))) {
                        got.add(r.value());
                    }
                }
                consumer.commitSync();
            }
            check(got.equals(List.of("v0", "v1", "v2", "v3", "v4")), "consumer authenticated with the token read them: " + got);

            // No tokens from a token-authenticated connection, nor over PLAINTEXT.
            try (Admin tokenAdmin = Admin.create(byToken)) {
                Throwable e = failure(() -> tokenAdmin.createDelegationToken().delegationToken().get());
                check(e instanceof UnsupportedByAuthenticationException, "no token from a token's session: " + e);
            }
            Properties plain = new Properties();
            plain.put("bootstrap.servers", plaintext);
            plain.put("default.api.timeout.ms", "15000");
            plain.put("request.timeout.ms", "10000");
            try (Admin plainAdmin = Admin.create(plain)) {
                Throwable e = failure(() -> plainAdmin.createDelegationToken().delegationToken().get());
                check(e instanceof UnsupportedByAuthenticationException, "no token over PLAINTEXT: " + e);
            }
            // Only the owner and renewers may renew or expire it.
            try (Admin bob = Admin.create(scram("bob", "bob-secret", false))) {
                Throwable e = failure(() -> bob.renewDelegationToken(token.hmac()).expiryTimestamp().get());
                check(e instanceof DelegationTokenOwnerMismatchException, "bob may not renew it: " + e);
            }
            try (Admin aliceAdmin = Admin.create(scram("alice", "alice-secret", false))) {
                aliceAdmin.expireDelegationToken(token.hmac(),
                        new ExpireDelegationTokenOptions().expiryTimePeriodMs(-1)).expiryTimestamp().get();
                check(true, "alice (renewer) expired it at once");
            }
            check(admin.describeDelegationToken().delegationTokens().get().stream()
                    .noneMatch(t -> t.tokenInfo().tokenId().equals(info.tokenId())), "describe no longer lists it");
            Throwable e = failure(() -> admin.renewDelegationToken(token.hmac()).expiryTimestamp().get());
            check(e instanceof DelegationTokenNotFoundException, "renewing it now: " + e);
            try (Admin tokenAdmin = Admin.create(byToken)) {
                Throwable refused = failure(() -> tokenAdmin.listTopics().names().get());
                check(refused instanceof SaslAuthenticationException, "the expired token no longer authenticates: " + refused);
            }
        }
    }
}
