package cluster

// Three voters and two learners, as in d-engine's published runs: five real processes, two of
// them learners added through the Cluster API (the second while the first is still a learner)
// while a writer keeps writing. A learner serves only what etcd lets a learner serve — Status
// and serializable Range (server/etcdserver/api/v3rpc/util.go, isRPCSupportedForLearner) — and
// refuses every other unary RPC and every stream but Snapshot (interceptor.go) with
// "etcdserver: rpc not supported for learner". The voters serve linearizable reads and writes
// meanwhile; once both learners are promoted, the five members hold the same data.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// learnerSetup is how many learners the server under test may hold at once, the flags that
// allow it and the gRPC code its learners refuse with. cairn follows etcd 3.5
// (rpctypes.ErrGPRCNotSupportedForLearner, code Unavailable) and holds two learners with
// --max-learners 2. etcd 3.5 has no --max-learners and holds one learner at a time
// (membership.maxLearners = 1), so against it the journey runs with one learner; etcd 3.6 has
// the flag and refuses with FailedPrecondition (its ErrGRPCNotSupportedForLearner).
func learnerSetup(t *testing.T) (learners int, extra []string, code codes.Code) {
	if etcdBin() == "" {
		return 2, []string{"--max-learners", "2"}, codes.Unavailable
	}
	major, minor := etcdVersion(t)
	if major == 3 && minor < 6 {
		return 1, nil, codes.Unavailable
	}
	return 2, []string{"--max-learners", "2"}, codes.FailedPrecondition
}

// etcdVersion is the major and minor version of CLUSTER_ETCD's etcd; for cairn, the etcd
// version it follows (3.5: learners, errors and the Snapshot stream as etcd 3.5 has them).
func etcdVersion(t *testing.T) (major, minor int) {
	e := etcdBin()
	if e == "" {
		return 3, 5
	}
	out, err := exec.Command(e, "--version").Output()
	if err != nil {
		t.Fatalf("%s --version: %v", e, err)
	}
	if _, err := fmt.Sscanf(string(out), "etcd Version: %d.%d", &major, &minor); err != nil {
		t.Fatalf("%s --version says %q: %v", e, out, err)
	}
	return major, minor
}

// TestThreeVotersTwoLearners: three voters holding 1,000 keys take two learners at once, each
// added through the Cluster API and started from an empty data directory while a writer keeps
// writing. Once both caught up, each learner, reached alone by the official client, serves
// serializable Range, Status (reporting itself a learner) and Snapshot, and refuses with
// etcd's error linearizable Range, Put, DeleteRange, Txn (even a read-only one), LeaseGrant,
// Watch, LeaseKeepAlive, MemberList and HashKV (with etcd's gRPC code on the wire); none of
// the refused writes takes effect, and a clientv3 Watch on a learner delivers nothing. Every
// voter serves linearizable reads and writes meanwhile. Both learners are then promoted, and
// the five members end as voters with the same HashKV.
func TestThreeVotersTwoLearners(t *testing.T) {
	n, extra, refusal := learnerSetup(t)
	if n < 2 {
		t.Logf("%s holds one learner at a time (etcd < 3.6): the journey runs with one", etcdBin())
	}
	c := startCluster(t, 3, defaultBin(t), extra...)
	voters := []int{0, 1, 2}
	admin := c.client(c.endpoints()...) // the voters only: learners would refuse its writes
	c.leader(admin)
	load(t, admin, 1_000)

	w := startWriter(admin)
	var changes []time.Time
	var learners []int
	ids := map[int]uint64{}
	with := append([]int{}, voters...)
	for k := 0; k < n; k++ {
		i, id, at := c.addLearnerOnceHealthy(admin, with)
		learners, ids[i], changes = append(learners, i), id, append(changes, at)
		with = append(with, i) // a later member's --initial-cluster lists every member
		// etcd checks a joining member's --initial-cluster against the members it finds at
		// start: the next add must wait until this one has joined.
		c.awaitServing(admin, i, id)
	}
	c.checkRoles(admin, ids)
	marker := c.awaitCaughtUp(admin, learners)

	for _, i := range learners {
		c.checkLearner(admin, i, ids[i], marker, refusal)
	}
	c.checkRefusedWritesAbsent(admin)
	for _, i := range voters {
		c.checkVoterServes(i)
	}

	for _, i := range learners {
		changes = append(changes, c.promote(admin, ids[i]))
	}
	time.Sleep(500 * time.Millisecond) // writes after the last change reach all five
	w.finish(t, changes, 50)

	c.leader(admin)
	c.checkRoles(admin, nil)
	for i, m := range c.members {
		cx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		s, err := admin.Status(cx, m.url)
		cancel()
		if err != nil || s.IsLearner {
			t.Errorf("status of %s after the promotions: want a voter, got %v (err %v)", m.name, s, err)
		}
		if contains(learners, i) {
			c.checkVoterServes(i)
		}
	}
	c.convergence(admin)
}

// memberAddOnceHealthy adds a member reached at url (a learner if asked) through cl, retrying
// for at most `within` while the cluster answers ErrUnhealthy: etcd adds a member only once its
// leader has been connected to every voter for 5 s (server.go, mayAddMember), which a cluster
// just started is not. Returns the last answer.
func memberAddOnceHealthy(cl *clientv3.Client, url string, learner bool, within time.Duration) (*clientv3.MemberAddResponse, error) {
	add := cl.MemberAdd
	if learner {
		add = cl.MemberAddAsLearner
	}
	for deadline := time.Now().Add(within); ; time.Sleep(200 * time.Millisecond) {
		cx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		added, err := add(cx, []string{url})
		cancel()
		if err == nil || !errors.Is(err, rpctypes.ErrUnhealthy) || time.Now().After(deadline) {
			return added, err
		}
	}
}

// addLearnerOnceHealthy is addLearner retrying (at most 20 s) while the cluster answers
// ErrUnhealthy: etcd adds a member only once the leader has been connected to every voter for
// 5 s (server.go, mayAddMember), which a cluster just started is not.
func (c *cluster) addLearnerOnceHealthy(cl *clientv3.Client, with []int) (int, uint64, time.Time) {
	c.t.Helper()
	i := c.addMember(with)
	deadline := time.Now().Add(20 * time.Second)
	for {
		c.failIfCrashed()
		cx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		added, err := cl.MemberAddAsLearner(cx, []string{c.member(i).peerURL()})
		cancel()
		if err == nil {
			at := time.Now()
			c.start(i)
			return i, added.Member.ID, at
		}
		if !errors.Is(err, rpctypes.ErrUnhealthy) || time.Now().After(deadline) {
			c.t.Fatalf("member add: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// awaitServing waits (at most 20 s) until member i answers Status as the member id.
func (c *cluster) awaitServing(cl *clientv3.Client, i int, id uint64) {
	c.t.Helper()
	m := c.member(i)
	var err error
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		c.failIfCrashed()
		cx, cancel := context.WithTimeout(context.Background(), time.Second)
		var s *clientv3.StatusResponse
		s, err = cl.Status(cx, m.url)
		cancel()
		if err == nil && s.Header.MemberId == id {
			return
		}
	}
	c.t.Fatalf("%s (%x) never served after it was started (last error %v); logs in %s", m.name, id, err, c.root)
}

// checkRoles fails the test unless the member list (asked of a voter) holds the three voters
// plus the members in learners, exactly those flagged as learners. With no learners, every
// member must also have started (published its name).
func (c *cluster) checkRoles(admin *clientv3.Client, learners map[int]uint64) {
	c.t.Helper()
	cx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	list, err := admin.MemberList(cx)
	cancel()
	if err != nil {
		c.t.Fatalf("member list: %v", err)
	}
	want := len(c.members)
	if len(list.Members) != want {
		c.t.Fatalf("member list holds %d members, want %d: %v", len(list.Members), want, list.Members)
	}
	isLearner := map[uint64]bool{}
	for _, id := range learners {
		isLearner[id] = true
	}
	for _, m := range list.Members {
		if m.IsLearner != isLearner[m.ID] {
			c.t.Fatalf("member %x (%q) is a learner: %v, want %v; list %v",
				m.ID, m.Name, m.IsLearner, isLearner[m.ID], list.Members)
		}
		if len(learners) == 0 && m.Name == "" {
			c.t.Fatalf("member %x never started: %v", m.ID, list.Members)
		}
	}
}

// awaitCaughtUp writes a marker through the voters and waits (at most 30 s) until every
// learner's serializable read sees it. Returns the marker's revision.
func (c *cluster) awaitCaughtUp(admin *clientv3.Client, learners []int) int64 {
	c.t.Helper()
	cx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	put, err := admin.Put(cx, "marker", "caught up")
	cancel()
	if err != nil {
		c.t.Fatalf("put marker: %v", err)
	}
	rev := put.Header.Revision
	for _, i := range learners {
		m := c.member(i)
		lc := c.client(m.url)
		var last string
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			c.failIfCrashed()
			cx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			got, err := lc.Get(cx, "marker", clientv3.WithSerializable())
			cancel()
			if err == nil && len(got.Kvs) == 1 && got.Kvs[0].ModRevision == rev {
				break
			}
			last = fmt.Sprintf("%v %v", got, err)
			if time.Now().After(deadline) {
				c.t.Fatalf("learner %s never saw the marker at revision %d (last: %s); logs in %s",
					m.name, rev, last, c.root)
			}
		}
	}
	return rev
}

// checkLearner checks, with a client of learner i alone, what a learner serves and what it
// refuses. Mismatches are errors, not fatal, so that one run reports them all.
func (c *cluster) checkLearner(admin *clientv3.Client, i int, id uint64, marker int64, refusal codes.Code) {
	m := c.member(i)
	lc := c.client(m.url)
	ctx := func() (context.Context, context.CancelFunc) {
		// The client retries an Unavailable refusal of a read up to 100 times, 25 ms apart.
		return context.WithTimeout(context.Background(), 10*time.Second)
	}
	// clientv3 turns a known message into its own rpctypes.EtcdError, whose code comes from
	// the client's table (Unavailable in 3.5.17) rather than from the wire: the message is
	// checked through clientv3, the code on the wire through the raw gRPC stubs.
	wantMsg := status.Convert(rpctypes.ErrGPRCNotSupportedForLearner).Message()
	refused := func(what string, err error) {
		if _, msg := codeAndMessage(err); err == nil || msg != wantMsg {
			c.t.Errorf("%s on learner %s: want %q (etcd's refusal for learners), got %s",
				what, m.name, wantMsg, describeErr(err))
		}
	}
	refusedOnWire := func(what string, err error) {
		if code, msg := codeAndMessage(err); err == nil || code != refusal || msg != wantMsg {
			c.t.Errorf("%s on learner %s: want %s %q on the wire (etcd's refusal for learners), got %s",
				what, m.name, refusal, wantMsg, describeErr(err))
		}
	}

	// Served: serializable Range, with the data the voters hold.
	cx, cancel := ctx()
	got, err := lc.Get(cx, "load/", clientv3.WithPrefix(), clientv3.WithSerializable())
	cancel()
	if err != nil {
		c.t.Errorf("serializable range on learner %s: %v", m.name, err)
	} else if len(got.Kvs) != 1_000 || got.Header.Revision < marker {
		c.t.Errorf("serializable range on learner %s: %d keys at revision %d, want 1000 at %d or later",
			m.name, len(got.Kvs), got.Header.Revision, marker)
	} else {
		for _, kv := range got.Kvs {
			if string(kv.Value) != strings.Repeat("v", 100) {
				c.t.Errorf("learner %s holds %s = %q", m.name, kv.Key, kv.Value)
				break
			}
		}
	}

	// Served: Status, reporting a learner.
	cx, cancel = ctx()
	s, err := lc.Status(cx, m.url)
	cancel()
	switch {
	case err != nil:
		c.t.Errorf("status on learner %s: %v", m.name, err)
	case !s.IsLearner || s.Header.MemberId != id:
		c.t.Errorf("status on learner %s: is_learner %v, member id %x; want true, %x",
			m.name, s.IsLearner, s.Header.MemberId, id)
	}

	// Served: Snapshot, the one stream a learner serves (from etcd 3.5, PR 12890; etcd 3.4
	// refuses every stream on a learner).
	cx, cancel = ctx()
	snap, err := lc.Snapshot(cx)
	var n int64
	if err == nil {
		n, err = io.Copy(io.Discard, snap)
	}
	cancel()
	if major, minor := etcdVersion(c.t); major == 3 && minor < 5 {
		if err == nil {
			c.t.Errorf("snapshot on learner %s: served %d bytes; etcd 3.4 refuses it", m.name, n)
		}
	} else if err != nil || n == 0 {
		c.t.Errorf("snapshot on learner %s: %d bytes, %s", m.name, n, describeErr(err))
	}

	// Refused: everything else.
	cx, cancel = ctx()
	_, err = lc.Get(cx, "marker")
	cancel()
	refused("linearizable Range", err)

	cx, cancel = ctx()
	_, err = lc.Put(cx, "learner/put", m.name)
	cancel()
	refused("Put", err)

	cx, cancel = ctx()
	_, err = lc.Delete(cx, "load/", clientv3.WithPrefix())
	cancel()
	refused("DeleteRange", err)

	cx, cancel = ctx()
	_, err = lc.Txn(cx).If(clientv3.Compare(clientv3.Version("marker"), ">", 0)).
		Then(clientv3.OpPut("learner/txn", m.name)).Commit()
	cancel()
	refused("Txn", err)

	cx, cancel = ctx()
	_, err = lc.Txn(cx).Then(clientv3.OpGet("marker", clientv3.WithSerializable())).Commit()
	cancel()
	refused("read-only Txn of a serializable Range", err)

	cx, cancel = ctx()
	_, err = lc.Grant(cx, 60)
	cancel()
	refused("LeaseGrant", err)

	refusedOnWire("Watch", watchOnce(lc))
	refusedOnWire("LeaseKeepAlive", keepAliveOnce(admin, lc))

	// The raw stubs: no retries (the default policy does not retry a refusal) and no
	// translation of the error.
	cx, cancel = ctx()
	_, err = pb.NewKVClient(lc.ActiveConnection()).Range(cx, &pb.RangeRequest{Key: []byte("marker")})
	cancel()
	refusedOnWire("linearizable Range (raw stub)", err)

	cx, cancel = ctx()
	_, err = pb.NewKVClient(lc.ActiveConnection()).Put(cx, &pb.PutRequest{Key: []byte("learner/raw"), Value: []byte(m.name)})
	cancel()
	refusedOnWire("Put (raw stub)", err)

	cx, cancel = ctx()
	_, err = pb.NewClusterClient(lc.ActiveConnection()).MemberList(cx, &pb.MemberListRequest{})
	cancel()
	refusedOnWire("MemberList (raw stub)", err)

	cx, cancel = ctx()
	_, err = lc.MemberList(cx)
	cancel()
	refused("MemberList", err)

	cx, cancel = ctx()
	_, err = lc.HashKV(cx, m.url, 0)
	cancel()
	refused("HashKV", err)

	// What a user of clientv3.Watch sees: the client reopens the refused stream (the refusal
	// is Unavailable in etcd 3.5) and delivers nothing, even when a voter writes the key.
	wx, cancelWatch := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancelWatch()
	delivered := make(chan []string, 1)
	go func() {
		var seen []string
		for resp := range lc.Watch(wx, "learner/watched") { // Watch blocks while refused
			for _, ev := range resp.Events {
				seen = append(seen, fmt.Sprintf("%s %s=%q at revision %d",
					ev.Type, ev.Kv.Key, ev.Kv.Value, ev.Kv.ModRevision))
			}
		}
		delivered <- seen
	}()
	time.Sleep(300 * time.Millisecond)
	cx, cancel = ctx()
	_, err = admin.Put(cx, "learner/watched", m.name)
	cancel()
	if err != nil {
		c.t.Fatalf("put through a voter: %v", err)
	}
	select {
	case seen := <-delivered:
		if len(seen) > 0 {
			c.t.Errorf("a clientv3 Watch on learner %s delivered %v", m.name, seen)
		}
	case <-time.After(10 * time.Second):
		c.t.Errorf("a clientv3 Watch on learner %s did not end with its context", m.name)
	}
}

// watchOnce opens a Watch stream on cl's connection (the raw gRPC stub: clientv3.Watch would
// retry the refusal for ever), asks for a watcher, and returns the error the stream ends
// with, or nil if the watch was created.
func watchOnce(cl *clientv3.Client) error {
	cx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ws, err := pb.NewWatchClient(cl.ActiveConnection()).Watch(cx)
	if err != nil {
		return err
	}
	create := &pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{
		CreateRequest: &pb.WatchCreateRequest{Key: []byte("load/"), RangeEnd: []byte("load0")}}}
	if err := ws.Send(create); err != nil && !errors.Is(err, io.EOF) {
		return err // io.EOF: the server ended the stream, Recv tells why
	}
	resp, err := ws.Recv()
	if err != nil {
		return err
	}
	if !resp.Created {
		return fmt.Errorf("the watch answered %v", resp)
	}
	return nil
}

// keepAliveOnce grants a lease through admin and keeps it alive once through a LeaseKeepAlive
// stream on cl's connection (the raw stub, as in watchOnce). Returns the error the stream
// ends with, or nil if the lease was kept alive.
func keepAliveOnce(admin, cl *clientv3.Client) error {
	cx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	lease, err := admin.Grant(cx, 60)
	if err != nil {
		return fmt.Errorf("lease grant through the voters: %w", err)
	}
	ks, err := pb.NewLeaseClient(cl.ActiveConnection()).LeaseKeepAlive(cx)
	if err != nil {
		return err
	}
	if err := ks.Send(&pb.LeaseKeepAliveRequest{ID: int64(lease.ID)}); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	resp, err := ks.Recv()
	if err != nil {
		return err
	}
	if resp.TTL <= 0 {
		return fmt.Errorf("the keep-alive answered %v", resp)
	}
	return nil
}

// checkRefusedWritesAbsent fails the test if a write a learner refused took effect anyway.
func (c *cluster) checkRefusedWritesAbsent(admin *clientv3.Client) {
	c.t.Helper()
	cx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got, err := admin.Get(cx, "learner/", clientv3.WithPrefix())
	if err != nil {
		c.t.Fatalf("get learner/: %v", err)
	}
	for _, kv := range got.Kvs {
		if string(kv.Key) != "learner/watched" { // written through a voter
			c.t.Errorf("a write refused by a learner took effect: %s = %q", kv.Key, kv.Value)
		}
	}
	count, err := admin.Get(cx, "load/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		c.t.Fatalf("count load/: %v", err)
	}
	if count.Count != 1_000 {
		c.t.Errorf("a DeleteRange refused by a learner took effect: %d of 1000 keys left", count.Count)
	}
}

// checkVoterServes writes and reads back linearizably through a client of member i alone.
func (c *cluster) checkVoterServes(i int) {
	c.t.Helper()
	m := c.member(i)
	vc := c.client(m.url)
	key := "voter/" + m.name
	cx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	put, err := vc.Put(cx, key, m.name)
	if err != nil {
		c.t.Errorf("put on voter %s: %v", m.name, err)
		return
	}
	got, err := vc.Get(cx, key)
	if err != nil {
		c.t.Errorf("linearizable range on voter %s: %v", m.name, err)
		return
	}
	if len(got.Kvs) != 1 || string(got.Kvs[0].Value) != m.name || got.Kvs[0].ModRevision != put.Header.Revision {
		c.t.Errorf("linearizable range on voter %s after its put at revision %d: %v",
			m.name, put.Header.Revision, got.Kvs)
	}
}

// promote promotes the learner id through cl, retrying (at most 30 s) while it is not ready.
// Returns the moment of the change.
func (c *cluster) promote(cl *clientv3.Client, id uint64) time.Time {
	c.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		c.failIfCrashed()
		cx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		at := time.Now()
		_, err := cl.MemberPromote(cx, id)
		cancel()
		if err == nil {
			return at
		}
		if !errors.Is(err, rpctypes.ErrMemberLearnerNotReady) {
			c.t.Fatalf("member promote %x: %v", id, err)
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("the learner %x never caught up; logs in %s", id, c.root)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// codeAndMessage is the gRPC code and message of an error from clientv3 (which turns etcd's
// errors into rpctypes.EtcdError) or from a raw stub.
func codeAndMessage(err error) (codes.Code, string) {
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		return ee.Code(), ee.Error()
	}
	s := status.Convert(err)
	return s.Code(), s.Message()
}

func describeErr(err error) string {
	if err == nil {
		return "success"
	}
	code, msg := codeAndMessage(err)
	return fmt.Sprintf("%s %q", code, msg)
}

func contains(xs []int, x int) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}
