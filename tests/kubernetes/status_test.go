package k8scontract

import (
	"strings"
	"testing"

	"github.com/coreos/go-semver/semver"
)

// TestMaintenanceStatus: what kube-apiserver reads from Maintenance.Status: the version, which
// must parse as semver and pass its RequestWatchProgress gate (>= 3.4.25, not 3.5.0-3.5.7), and
// db_size for apiserver_storage_size_bytes.
func TestMaintenanceStatus(t *testing.T) {
	e := newEnv(t, serverOpts{})
	e.create("/registry/namespaces/default", "ns", 0)
	st, err := e.c.Status(e.ctx, e.s.url)
	noErr(t, err, "Maintenance.Status")
	t.Logf("version %q, db_size %d, db_size_in_use %d, leader %x, member %x", st.Version, st.DbSize, st.DbSizeInUse, st.Leader, st.Header.GetMemberId())
	v, err := semver.NewVersion(strings.TrimPrefix(st.Version, "v"))
	noErr(t, err, "version "+st.Version+" as semver")
	if st.DbSize <= 0 {
		t.Fatalf("db_size %d, want > 0", st.DbSize)
	}
	if st.Leader == 0 || st.Leader != st.Header.GetMemberId() {
		t.Fatalf("single member %x reports leader %x", st.Header.GetMemberId(), st.Leader)
	}
	t.Run("RequestWatchProgressGate", func(t *testing.T) {
		e.s.requireEtcd(t, watchProgressGate, "the version kube-apiserver requires before it uses RequestWatchProgress")
		if !watchProgressGate(*v) {
			t.Fatalf("version %s fails kube-apiserver's RequestWatchProgress gate (>= 3.4.25, not 3.5.0-3.5.7)", v)
		}
	})
}
