// franz-go's share consumer (KIP-932) against a Strata broker: records
// shared by several consumers of one group, each delivered, and released
// records delivered again with a higher delivery count.
package strata

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

func bootstrap(t *testing.T) string {
	b := os.Getenv("BOOTSTRAP")
	if b == "" {
		t.Fatal("BOOTSTRAP is not set (run integration/go/run.sh)")
	}
	return b
}

// setup creates a topic, makes the group read it from the start and
// produces n records v0..v{n-1}.
func setup(t *testing.T, topic, group string, partitions int32, n int) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(bootstrap(t)), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	create := kmsg.NewPtrCreateTopicsRequest()
	ct := kmsg.NewCreateTopicsRequestTopic()
	ct.Topic, ct.NumPartitions, ct.ReplicationFactor = topic, partitions, 1
	create.Topics = append(create.Topics, ct)
	created, err := create.RequestWith(ctx, cl)
	if err != nil || created.Topics[0].ErrorCode != 0 {
		t.Fatalf("create topic: %v %+v", err, created)
	}
	alter := kmsg.NewPtrIncrementalAlterConfigsRequest()
	res := kmsg.NewIncrementalAlterConfigsRequestResource()
	res.ResourceType, res.ResourceName = kmsg.ConfigResourceTypeGroupConfig, group
	c := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
	value := "earliest"
	c.Name, c.Value = "share.auto.offset.reset", &value
	res.Configs = append(res.Configs, c)
	alter.Resources = append(alter.Resources, res)
	altered, err := alter.RequestWith(ctx, cl)
	if err != nil || altered.Resources[0].ErrorCode != 0 {
		t.Fatalf("group config: %v %+v", err, altered)
	}
	for i := 0; i < n; i++ {
		if err := cl.ProduceSync(ctx, kgo.StringRecord(fmt.Sprintf("v%d", i))).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
}

func shareClient(t *testing.T, topic, group string) *kgo.Client {
	cl, err := kgo.NewClient(kgo.SeedBrokers(bootstrap(t)), kgo.ConsumeTopics(topic), kgo.ShareGroup(group))
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

func name(t *testing.T, what string) string {
	return fmt.Sprintf("go-%s-%d", what, time.Now().UnixNano())
}

func TestThreeShareConsumersOnTwoPartitionsReceiveEveryRecord(t *testing.T) {
	topic, group := name(t, "share"), name(t, "share-g")
	const total = 300
	setup(t, topic, group, 2, total)
	var mu sync.Mutex
	seen := map[string]int{}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for i := 0; i < 3; i++ {
		cl := shareClient(t, topic, group)
		defer cl.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				fetches := cl.PollFetches(ctx)
				mu.Lock()
				for _, r := range fetches.Records() {
					seen[string(r.Value)]++
					r.Ack(kgo.AckAccept)
				}
				done := len(seen) == total
				mu.Unlock()
				if done {
					cancel()
				}
			}
		}()
	}
	wg.Wait()
	if len(seen) != total {
		t.Fatalf("received %d distinct records of %d", len(seen), total)
	}
}

func TestAReleasedRecordComesBackWithDeliveryCountTwo(t *testing.T) {
	topic, group := name(t, "release"), name(t, "release-g")
	setup(t, topic, group, 1, 10)
	cl := shareClient(t, topic, group)
	defer cl.Close()
	deliveries := map[string][]int32{}
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	for ctx.Err() == nil {
		for _, r := range cl.PollFetches(ctx).Records() {
			v := string(r.Value)
			deliveries[v] = append(deliveries[v], r.DeliveryCount())
			if r.DeliveryCount() == 1 && v == "v3" {
				r.Ack(kgo.AckRelease)
			} else {
				r.Ack(kgo.AckAccept)
			}
		}
		if len(deliveries) == 10 && len(deliveries["v3"]) == 2 {
			break
		}
	}
	if got := deliveries["v3"]; len(got) != 2 || got[0] != 1 || got[1] != 2 {
		t.Fatalf("v3 delivered %v, want [1 2]", got)
	}
	for v, d := range deliveries {
		if v != "v3" && len(d) != 1 {
			t.Fatalf("%s delivered %v, want once", v, d)
		}
	}
	if len(deliveries) != 10 {
		t.Fatalf("received %d distinct records of 10", len(deliveries))
	}
}
