package cluster

// The workload: workers pinned two to each member (so followers serve reads through ReadIndex
// and forward writes), each doing linearizable gets, puts of unique values and
// compare-and-swaps on a few shared keys, recording every call in the history.

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

var workloadKeys = []string{"k0", "k1", "k2", "k3", "k4"}

// startWorkers runs workers until stop is closed; the returned function waits for them.
func startWorkers(c *cluster, h *history, seed int64, perMember int, stop <-chan struct{}) func() {
	var wg sync.WaitGroup
	live := c.live()
	c.seats = &seats{}
	for w := 0; w < perMember*len(live); w++ {
		i := live[w%len(live)]
		c.seats.member = append(c.seats.member, i)
		c.seats.clients = append(c.seats.clients, c.client(c.member(i).url))
		rng := rand.New(rand.NewSource(seed*1000 + int64(w)))
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			worker(h, func() *clientv3.Client { return c.seats.client(w) }, w, rng, stop)
		}(w)
	}
	return wg.Wait
}

// seats pins each worker to one member. A member replaced through the Cluster API hands its
// workers to its replacement once that is a voter: until then they keep calling the removed
// member, whose refusals are failed reads (not recorded) and writes of unknown outcome.
type seats struct {
	mu      sync.Mutex
	member  []int // per worker, the member it calls
	clients []*clientv3.Client
}

func (s *seats) client(w int) *clientv3.Client {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.clients[w]
}

// reseat moves the workers of member from to member to, each with a new client of it alone.
func (c *cluster) reseat(from, to int) {
	if c.seats == nil {
		return
	}
	url := c.member(to).url
	for w := range c.seats.member {
		c.seats.mu.Lock()
		moves := c.seats.member[w] == from
		c.seats.mu.Unlock()
		if !moves {
			continue
		}
		cl := c.client(url)
		c.seats.mu.Lock()
		c.seats.member[w], c.seats.clients[w] = to, cl
		c.seats.mu.Unlock()
	}
}

func worker(h *history, seat func() *clientv3.Client, w int, rng *rand.Rand, stop <-chan struct{}) {
	client := h.newClient()
	last := map[string]string{} // the last value this worker saw per key, to compare against
	for seq := 0; ; seq++ {
		select {
		case <-stop:
			return
		default:
		}
		in := kvInput{key: workloadKeys[rng.Intn(len(workloadKeys))]}
		switch r := rng.Intn(100); {
		case r < 50:
			in.kind = opGet
		case r < 80 || last[in.key] == "":
			in.kind, in.value = opPut, fmt.Sprintf("w%d.%d", w, seq)
		default:
			in.kind, in.value, in.expect = opCAS, fmt.Sprintf("w%d.%d", w, seq), last[in.key]
		}
		call := h.now()
		out, err := do(seat(), in)
		switch {
		case err == nil:
			h.add(client, in, call, out)
			if in.kind == opGet {
				last[in.key] = out.value
			}
		case in.kind == opGet:
			// A failed read took no effect: nothing to record.
		default:
			h.add(client, in, call, kvOutput{unknown: true})
			client = h.newClient()
		}
		if err != nil {
			time.Sleep(time.Duration(20+rng.Intn(60)) * time.Millisecond)
		}
	}
}

// do makes one call with a 2 s deadline.
func do(cl *clientv3.Client, in kvInput) (kvOutput, error) {
	cx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	switch in.kind {
	case opGet:
		resp, err := cl.Get(cx, in.key)
		if err != nil {
			return kvOutput{}, err
		}
		if len(resp.Kvs) == 0 {
			return kvOutput{}, nil
		}
		return kvOutput{value: string(resp.Kvs[0].Value)}, nil
	case opPut:
		_, err := cl.Put(cx, in.key, in.value)
		return kvOutput{}, err
	default:
		resp, err := cl.Txn(cx).
			If(clientv3.Compare(clientv3.Value(in.key), "=", in.expect)).
			Then(clientv3.OpPut(in.key, in.value)).Commit()
		if err != nil {
			return kvOutput{}, err
		}
		return kvOutput{ok: resp.Succeeded}, nil
	}
}

// finalReads reads every key through every member (not removed) once the cluster has healed,
// so that the history ends with what each member serves. Each read is retried for at most 10 s.
func finalReads(c *cluster, h *history) error {
	client := h.newClient()
	for _, i := range c.live() {
		cl := c.client(c.member(i).url)
		for _, k := range workloadKeys {
			in := kvInput{kind: opGet, key: k}
			deadline := time.Now().Add(10 * time.Second)
			for {
				call := h.now()
				out, err := do(cl, in)
				if err == nil {
					h.add(client, in, call, out)
					break
				}
				if time.Now().After(deadline) {
					return errors.Join(fmt.Errorf("m%d cannot serve a read of %s after healing", i, k), err)
				}
				time.Sleep(100 * time.Millisecond)
			}
		}
	}
	return nil
}
