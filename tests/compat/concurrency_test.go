package compat

// go.etcd.io/etcd/client/v3/concurrency (sessions, mutexes, elections, STM) is built on leases,
// transactions and watches; Kubernetes-style controllers and many etcd users rely on it.

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// concClient is a client of its own (s.client shares nothing either, but this one can be
// closed by the test to stand for a crashed process).
func concClient(t *testing.T, s *server) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{s.url}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func concSession(t *testing.T, c *clientv3.Client, opts ...concurrency.SessionOption) *concurrency.Session {
	t.Helper()
	sess, err := concurrency.NewSession(c, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return sess
}

func TestConcurrencyMutex(t *testing.T) {
	defer leaseFailOnPanic(t)
	t.Parallel()
	s := startServer(t, "")
	c := s.client()
	x, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const workers, rounds, counter = 8, 25, "/counter"
	must(c.Put(x, counter, "0"))
	clients := make([]*clientv3.Client, workers)
	for i := range clients {
		clients[i] = concClient(t, s)
	}
	var holders atomic.Int32
	var errs firstErr
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(cl *clientv3.Client) {
			defer wg.Done()
			sess, err := concurrency.NewSession(cl)
			if err != nil {
				errs.set(err)
				return
			}
			defer sess.Close()
			m := concurrency.NewMutex(sess, "/lock/")
			for r := 0; r < rounds && errs.get() == nil; r++ {
				if err := m.Lock(x); err != nil {
					errs.set(fmt.Errorf("lock: %w", err))
					return
				}
				if n := holders.Add(1); n != 1 {
					errs.set(fmt.Errorf("%d holders of the mutex at once", n))
				}
				got, err := cl.Get(x, counter)
				if err == nil {
					var v int
					v, err = strconv.Atoi(string(got.Kvs[0].Value))
					if err == nil {
						// Hold the lock across a little time so that overlaps would show.
						time.Sleep(time.Millisecond)
						_, err = cl.Put(x, counter, strconv.Itoa(v+1))
					}
				}
				holders.Add(-1)
				if err != nil {
					errs.set(err)
				}
				if err := m.Unlock(x); err != nil {
					errs.set(fmt.Errorf("unlock: %w", err))
					return
				}
			}
		}(clients[w])
	}
	wg.Wait()
	if err := errs.get(); err != nil {
		t.Fatal(err)
	}
	if got := string(must(c.Get(x, counter)).Kvs[0].Value); got != strconv.Itoa(workers*rounds) {
		t.Fatalf("counter %s, want %d", got, workers*rounds)
	}
	if left := must(c.Get(x, "/lock/", clientv3.WithPrefix(), clientv3.WithCountOnly())); left.Count != 0 {
		t.Fatalf("every waiter's key is gone after its unlock: %d left", left.Count)
	}
	// TryLock against a held mutex fails at once with ErrLocked; after the unlock it succeeds.
	s1, s2 := concSession(t, c), concSession(t, concClient(t, s))
	m1, m2 := concurrency.NewMutex(s1, "/try/"), concurrency.NewMutex(s2, "/try/")
	if err := m1.Lock(x); err != nil {
		t.Fatal(err)
	}
	if err := m2.TryLock(x); !errors.Is(err, concurrency.ErrLocked) {
		t.Fatalf("try lock of a held mutex: %v", err)
	}
	if err := m1.Unlock(x); err != nil {
		t.Fatal(err)
	}
	if err := m2.TryLock(x); err != nil {
		t.Fatalf("try lock of a free mutex: %v", err)
	}
	// A holder whose session ends (its lease revoked) loses the mutex to the next waiter.
	locked := make(chan error, 1)
	go func() { locked <- m1.Lock(x) }()
	select {
	case err := <-locked:
		t.Fatalf("lock of a held mutex returned: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	must(c.Revoke(x, s2.Lease()))
	select {
	case err := <-locked:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter did not get the mutex after the holder's lease was revoked")
	}
	if err := m1.Unlock(x); err != nil {
		t.Fatal(err)
	}
}

func TestConcurrencyElection(t *testing.T) {
	defer leaseFailOnPanic(t)
	t.Parallel()
	s := startServer(t, "")
	x, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const prefix = "/election/"
	// The observer has a session of its own and follows the leader's value.
	obs := concurrency.NewElection(concSession(t, concClient(t, s)), prefix)
	if _, err := obs.Leader(x); !errors.Is(err, concurrency.ErrElectionNoLeader) {
		t.Fatalf("no leader yet: %v", err)
	}
	seen := make(chan string, 100)
	go func() {
		for resp := range obs.Observe(x) {
			seen <- string(resp.Kvs[0].Value)
		}
		close(seen)
	}()
	var observed []string
	expect := func(v string) {
		t.Helper()
		select {
		case got, ok := <-seen:
			if !ok {
				t.Fatalf("observe closed; saw %q, waiting for %q", observed, v)
			}
			observed = append(observed, got)
			if got != v {
				t.Fatalf("observed %q, want %q last", observed, v)
			}
		case <-time.After(15 * time.Second):
			t.Fatalf("observed %q, still waiting for %q", observed, v)
		}
		if l := must(obs.Leader(x)); string(l.Kvs[0].Value) != v {
			t.Fatalf("leader %q, want %q", l.Kvs[0].Value, v)
		}
	}
	campaign := func(e *concurrency.Election, v string) <-chan error {
		done := make(chan error, 1)
		go func() { done <- e.Campaign(x, v) }()
		return done
	}
	blocked := func(done <-chan error, who string) {
		t.Helper()
		select {
		case err := <-done:
			t.Fatalf("%s won while another leads: %v", who, err)
		case <-time.After(300 * time.Millisecond):
		}
	}
	won := func(done <-chan error, who string) {
		t.Helper()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("%s: %v", who, err)
			}
		case <-time.After(15 * time.Second):
			t.Fatalf("%s did not win", who)
		}
	}

	s1 := concSession(t, concClient(t, s))
	e1 := concurrency.NewElection(s1, prefix)
	won(campaign(e1, "v1"), "the first candidate")
	expect("v1")
	if err := e1.Proclaim(x, "v2"); err != nil {
		t.Fatal(err)
	}
	expect("v2")

	// Resign hands over to the next candidate in line.
	// (A short TTL: a session learns that its lease is gone from its next keepalive, TTL/3 on.)
	s2 := concSession(t, concClient(t, s), concurrency.WithTTL(leaseMinTTL))
	e2 := concurrency.NewElection(s2, prefix)
	d2 := campaign(e2, "w1")
	blocked(d2, "the second candidate")
	if err := e1.Resign(x); err != nil {
		t.Fatal(err)
	}
	won(d2, "the second candidate after the resign")
	expect("w1")

	// The leader's lease revoked: the leader key goes, the next candidate wins, and the old
	// leader's session sees its end.
	c3 := concClient(t, s)
	s3 := concSession(t, c3, concurrency.WithTTL(leaseMinTTL))
	e3 := concurrency.NewElection(s3, prefix)
	d3 := campaign(e3, "x1")
	blocked(d3, "the third candidate")
	must(c3.Revoke(x, s2.Lease()))
	won(d3, "the third candidate after the leader's lease was revoked")
	expect("x1")
	select {
	case <-s2.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("a session whose lease was revoked ends")
	}

	// The leader's process dies (its client closes, nobody resigns): its lease expires and the
	// next candidate wins about a TTL later.
	s4 := concSession(t, concClient(t, s))
	e4 := concurrency.NewElection(s4, prefix)
	d4 := campaign(e4, "y1")
	blocked(d4, "the fourth candidate")
	c3.Close()
	closed := time.Now()
	won(d4, "the fourth candidate after the leader's client closed")
	t.Logf("leadership moved %v after the leader's client closed (session TTL %d s)", time.Since(closed), leaseMinTTL)
	expect("y1")
	if fmt.Sprint(observed) != "[v1 v2 w1 x1 y1]" {
		t.Fatalf("observed %q", observed)
	}
	if err := e4.Resign(x); err != nil {
		t.Fatal(err)
	}
	if _, err := obs.Leader(x); !errors.Is(err, concurrency.ErrElectionNoLeader) {
		t.Fatalf("no leader after the last one resigned: %v", err)
	}
}

// Transfers between accounts under the STM's serializable isolation levels conserve the total,
// and a read-only audit inside a transaction always sees a consistent snapshot.
func TestConcurrencySTMTransfers(t *testing.T) {
	defer leaseFailOnPanic(t)
	t.Parallel()
	for _, iso := range []struct {
		name string
		iso  concurrency.Isolation
	}{
		{"SerializableSnapshot (the default)", concurrency.SerializableSnapshot},
		{"Serializable", concurrency.Serializable},
		{"RepeatableReads", concurrency.RepeatableReads},
	} {
		t.Run(iso.name, func(t *testing.T) {
			defer leaseFailOnPanic(t)
			s := startServer(t, "")
			c := s.client()
			x, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			const accounts, initial, workers, transfers = 5, 100, 6, 20
			acct := func(i int) string { return fmt.Sprintf("/bank/%d", i) }
			for i := 0; i < accounts; i++ {
				must(c.Put(x, acct(i), strconv.Itoa(initial)))
			}
			var applies, commits atomic.Int64
			var errs firstErr
			var wg sync.WaitGroup
			for w := 0; w < workers; w++ {
				wg.Add(1)
				cl := concClient(t, s)
				go func(w int, cl *clientv3.Client) {
					defer wg.Done()
					rng := rand.New(rand.NewSource(int64(w)))
					for n := 0; n < transfers && errs.get() == nil; n++ {
						from, to := rng.Intn(accounts), rng.Intn(accounts-1)
						if to >= from {
							to++
						}
						amount := 1 + rng.Intn(30)
						audit := n%5 == 4
						_, err := concurrency.NewSTM(cl, func(stm concurrency.STM) error {
							applies.Add(1)
							if audit && iso.iso != concurrency.RepeatableReads {
								total := 0
								for i := 0; i < accounts; i++ {
									v, _ := strconv.Atoi(stm.Get(acct(i)))
									total += v
								}
								if total != accounts*initial {
									return fmt.Errorf("an audit saw a total of %d", total)
								}
								return nil
							}
							fv, _ := strconv.Atoi(stm.Get(acct(from)))
							tv, _ := strconv.Atoi(stm.Get(acct(to)))
							if amount > fv {
								amount = fv
							}
							stm.Put(acct(from), strconv.Itoa(fv-amount))
							stm.Put(acct(to), strconv.Itoa(tv+amount))
							return nil
						}, concurrency.WithIsolation(iso.iso), concurrency.WithAbortContext(x))
						if err != nil {
							errs.set(err)
							return
						}
						commits.Add(1)
					}
				}(w, cl)
			}
			wg.Wait()
			if err := errs.get(); err != nil {
				t.Fatal(err)
			}
			total := 0
			for _, kv := range must(c.Get(x, "/bank/", clientv3.WithPrefix())).Kvs {
				v, err := strconv.Atoi(string(kv.Value))
				if err != nil || v < 0 {
					t.Fatalf("account %s: %q", kv.Key, kv.Value)
				}
				total += v
			}
			if total != accounts*initial || commits.Load() != workers*transfers {
				t.Fatalf("total %d (want %d), %d commits", total, accounts*initial, commits.Load())
			}
			t.Logf("%d transactions, %d attempts", commits.Load(), applies.Load())
		})
	}
}
