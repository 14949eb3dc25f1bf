package cluster

// The recorded history and its judge: every client operation with its invocation and response
// times, checked with porcupine against a register per key (get, put, compare-and-swap).
//
// An operation whose outcome is unknown (a timeout, a connection lost mid-call) may or may not
// have taken effect: it is recorded with no response time, which porcupine reads as "still
// pending", free to take effect at any point after its call. A failed read took no effect and
// is not recorded.

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"
)

type opKind int

const (
	opGet opKind = iota
	opPut
	opCAS
)

type kvInput struct {
	kind   opKind
	key    string
	value  string // put and cas: the value written
	expect string // cas: the value compared against
}

type kvOutput struct {
	value   string // get: the value read ("" when absent)
	ok      bool   // cas: whether the comparison held
	unknown bool   // the call failed in a way that leaves its effect unknown
}

// kvModel is a register per key. A missing key reads as ""; a compare on a missing key's value
// fails, as etcd's does ("nil == empty string": etcd never matches a value on a missing key).
var kvModel = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		var keys []string
		for _, op := range history {
			k := op.Input.(kvInput).key
			if _, ok := byKey[k]; !ok {
				keys = append(keys, k)
			}
			byKey[k] = append(byKey[k], op)
		}
		sort.Strings(keys)
		var out [][]porcupine.Operation
		for _, k := range keys {
			out = append(out, byKey[k])
		}
		return out
	},
	Init: func() interface{} { return "" },
	Step: func(state, input, output interface{}) (bool, interface{}) {
		st, in, out := state.(string), input.(kvInput), output.(kvOutput)
		switch in.kind {
		case opGet:
			return out.value == st, st
		case opPut:
			return true, in.value
		default:
			holds := st != "" && st == in.expect
			next := st
			if holds {
				next = in.value
			}
			return out.unknown || out.ok == holds, next
		}
	},
	DescribeOperation: func(input, output interface{}) string {
		in, out := input.(kvInput), output.(kvOutput)
		var s string
		switch in.kind {
		case opGet:
			s = fmt.Sprintf("get(%s) -> %q", in.key, out.value)
		case opPut:
			s = fmt.Sprintf("put(%s, %q)", in.key, in.value)
		default:
			s = fmt.Sprintf("cas(%s, %q -> %q) -> %v", in.key, in.expect, in.value, out.ok)
		}
		if out.unknown {
			s += " (outcome unknown)"
		}
		return s
	},
	DescribeState: func(state interface{}) string { return fmt.Sprintf("%q", state) },
}

// history collects operations from concurrent clients.
type history struct {
	mu      sync.Mutex
	start   time.Time
	ops     []porcupine.Operation
	clients int
}

func newHistory() *history { return &history{start: time.Now()} }

// newClient is a fresh porcupine client id: a worker takes a new one after an operation with
// an unknown outcome, since that operation stays pending forever.
func (h *history) newClient() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.clients++
	return h.clients - 1
}

func (h *history) now() int64 { return int64(time.Since(h.start)) }

func (h *history) add(client int, in kvInput, call int64, out kvOutput) {
	ret := h.now()
	if out.unknown {
		ret = math.MaxInt64
	}
	op := porcupine.Operation{ClientId: client, Input: in, Call: call, Output: out, Return: ret}
	h.mu.Lock()
	h.ops = append(h.ops, op)
	h.mu.Unlock()
}

// operations returns the history without the writes of unknown outcome that no later
// operation can have depended on. A write of value v (values are unique) on key k is dropped
// when no read returned v, no compare-and-swap compared k against v, and no compare-and-swap
// on k that was called after the write began failed. Then, wherever the write might have taken
// effect, nothing saw the state it made, so the history is linearizable with it iff without it.
// (A failed compare-and-swap does see it: "not what I expected" may be v. Leaving that
// condition out once made a correct history fail.) Without this pruning, each pending write
// multiplies the states porcupine has to explore.
func (h *history) operations() []porcupine.Operation {
	h.mu.Lock()
	defer h.mu.Unlock()
	seen := map[string]bool{}
	lastFailedCAS := map[string]int64{} // per key, the latest call time of a failed compare
	for _, op := range h.ops {
		in, out := op.Input.(kvInput), op.Output.(kvOutput)
		switch in.kind {
		case opGet:
			seen[in.key+"\x00"+out.value] = true
		case opCAS:
			seen[in.key+"\x00"+in.expect] = true
			if !out.unknown && !out.ok && op.Call > lastFailedCAS[in.key] {
				lastFailedCAS[in.key] = op.Call
			}
		}
	}
	var kept []porcupine.Operation
	for _, op := range h.ops {
		in, out := op.Input.(kvInput), op.Output.(kvOutput)
		droppable := out.unknown && in.kind != opGet && !seen[in.key+"\x00"+in.value] &&
			lastFailedCAS[in.key] < op.Call
		if !droppable {
			kept = append(kept, op)
		}
	}
	return kept
}

// save writes the whole history, pruned operations included, as JSON lines, so that a failed
// run can be checked again and examined.
func (h *history) save(path string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	for _, op := range h.ops {
		in, out := op.Input.(kvInput), op.Output.(kvOutput)
		_, err := fmt.Fprintf(f, "{\"client\":%d,\"call\":%d,\"return\":%d,\"kind\":%d,\"key\":%q,"+
			"\"value\":%q,\"expect\":%q,\"out_value\":%q,\"ok\":%v,\"unknown\":%v}\n",
			op.ClientId, op.Call, op.Return, in.kind, in.key, in.value, in.expect, out.value, out.ok, out.unknown)
		if err != nil {
			return err
		}
	}
	return nil
}

// summary counts what a run did, for the log.
func (h *history) summary() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var gets, puts, cases, unknown int
	for _, op := range h.ops {
		switch op.Input.(kvInput).kind {
		case opGet:
			gets++
		case opPut:
			puts++
		default:
			cases++
		}
		if op.Output.(kvOutput).unknown {
			unknown++
		}
	}
	return fmt.Sprintf("%d gets, %d puts, %d compare-and-swaps, %d of unknown outcome",
		gets, puts, cases, unknown)
}

// check judges the history. When it is not linearizable, porcupine's visualization of the
// longest linearizable prefix per key is written to dir and its path returned.
func (h *history) check(dir string) (porcupine.CheckResult, string) {
	ops := h.operations()
	res, info := porcupine.CheckOperationsVerbose(kvModel, ops, 3*time.Minute)
	if res != porcupine.Illegal {
		return res, ""
	}
	_ = h.save(filepath.Join(dir, "history.jsonl"))
	path := filepath.Join(dir, "history.html")
	f, err := os.Create(path)
	if err != nil {
		return res, ""
	}
	defer f.Close()
	if err := porcupine.Visualize(kvModel, info, f); err != nil {
		return res, ""
	}
	return res, path
}
