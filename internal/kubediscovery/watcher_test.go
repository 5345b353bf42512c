package kubediscovery

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	clocktesting "k8s.io/utils/clock/testing"
)

const (
	ns       = "llm"
	selector = "app=vllm"
	grace    = 30 * time.Second
	// deadline bounds every wait for the Watcher; it is never reached
	// when the Watcher works.
	deadline = 20 * time.Second
)

// pod is a pod of the namespace watched, labelled app=vllm, Running with
// ip (phase Pending without one), Ready if ready.
func pod(name, ip string, ready bool) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": "vllm", "model": "llama"}},
		Status:     corev1.PodStatus{Phase: corev1.PodPending},
	}
	if ip != "" {
		p.Status.Phase, p.Status.PodIP = corev1.PodRunning, ip
	}
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: st}}
	return p
}

func engine(name, ip string, ready bool) Engine {
	return Engine{Name: name, IP: ip, Model: "llama", Ranks: 1, Ready: ready}
}

// fixture runs a Watcher over a fake cluster (its pods read through
// DynamicPods, as the binary reads them) with a fake clock and
// records what it reports.
type fixture struct {
	t      *testing.T
	client *dynamicfake.FakeDynamicClient
	clock  *clocktesting.FakeClock
	w      *Watcher

	mu      sync.Mutex
	reports [][]Engine
	changed chan struct{}
}

func newFixture(t *testing.T, cfg Config, objs ...*corev1.Pod) *fixture {
	t.Helper()
	f := &fixture{t: t, client: newCluster(t, objs...), clock: clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0)), changed: make(chan struct{}, 1)}
	cfg.Namespace = ns
	if cfg.Selector == "" {
		cfg.Selector = selector
	}
	cfg.ModelLabel = "model"
	if cfg.Grace == 0 {
		cfg.Grace = grace
	}
	cfg.Clock = f.clock
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	w, err := New(DynamicPods(f.client), cfg, func(set []Engine) {
		f.mu.Lock()
		f.reports = append(f.reports, set)
		f.mu.Unlock()
		select {
		case f.changed <- struct{}{}:
		default:
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	f.w = w
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return f
}

// count is how many sets were reported.
func (f *fixture) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.reports)
}

// awaitSet waits until the last set reported is want.
func (f *fixture) awaitSet(what string, want []Engine) {
	f.t.Helper()
	timeout := time.After(deadline)
	for {
		f.mu.Lock()
		var last []Engine
		ok := len(f.reports) > 0
		if ok {
			last = f.reports[len(f.reports)-1]
		}
		f.mu.Unlock()
		if ok && slices.Equal(last, want) {
			return
		}
		select {
		case <-f.changed:
		case <-timeout:
			f.t.Fatalf("%s: the last set reported is %+v (reported: %v), want %+v", what, last, ok, want)
		}
	}
}

// awaitTimer waits until the Watcher has armed its grace timer.
func (f *fixture) awaitTimer(what string) {
	f.t.Helper()
	f.await(what+": the grace timer armed", f.clock.HasWaiters)
}

// await polls cond (state the Watcher reaches without reporting a set)
// until it holds, within the deadline.
func (f *fixture) await(what string, cond func() bool) {
	f.t.Helper()
	end := time.Now().Add(deadline)
	for !cond() {
		if time.Now().After(end) {
			f.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func (f *fixture) create(p *corev1.Pod) {
	f.t.Helper()
	if _, err := f.client.Resource(podsResource).Namespace(p.Namespace).Create(context.Background(), unstructuredPod(f.t, p), metav1.CreateOptions{}); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) update(p *corev1.Pod) {
	f.t.Helper()
	if _, err := f.client.Resource(podsResource).Namespace(p.Namespace).Update(context.Background(), unstructuredPod(f.t, p), metav1.UpdateOptions{}); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) delete(name string) {
	f.t.Helper()
	if err := f.client.Resource(podsResource).Namespace(ns).Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
		f.t.Fatal(err)
	}
}

// step is one change to the cluster or the clock, and the set the
// Watcher must report after it. Steps that must change nothing
// (noReport) are checked by the next step's set, which would still show
// their pod: every report is the whole set.
type step struct {
	name     string
	do       func(f *fixture)
	want     []Engine
	noReport bool
}

func TestWatcher(t *testing.T) {
	a, b := engine("vllm-a", "10.0.0.1", true), engine("vllm-b", "10.0.0.2", true)
	aGone := a
	aGone.Ready = false
	tests := []struct {
		name    string
		initial []*corev1.Pod
		steps   []step
	}{
		{
			name:    "pods present at start, then added and deleted",
			initial: []*corev1.Pod{pod("vllm-a", "10.0.0.1", true)},
			steps: []step{
				{name: "initial list", do: func(*fixture) {}, want: []Engine{a}},
				{name: "add", do: func(f *fixture) { f.create(pod("vllm-b", "10.0.0.2", true)) }, want: []Engine{a, b}},
				{name: "delete: kept, not ready", do: func(f *fixture) { f.delete("vllm-a") }, want: []Engine{aGone, b}},
				{name: "grace runs out", do: func(f *fixture) { f.awaitTimer("delete"); f.clock.Step(grace) }, want: []Engine{b}},
			},
		},
		{
			name: "selector and namespace filter",
			steps: []step{
				{name: "initial list: none", do: func(*fixture) {}, want: []Engine{}},
				{name: "other labels", noReport: true, do: func(f *fixture) {
					p := pod("web", "10.0.0.9", true)
					p.Labels = map[string]string{"app": "web"}
					f.create(p)
				}},
				{name: "other namespace", noReport: true, do: func(f *fixture) {
					p := pod("vllm-x", "10.0.1.1", true)
					p.Namespace = "elsewhere"
					f.create(p)
				}},
				{name: "matching pod", do: func(f *fixture) { f.create(pod("vllm-a", "10.0.0.1", true)) }, want: []Engine{a}},
				{name: "relabelled out of the selector: grace", do: func(f *fixture) {
					p := pod("vllm-a", "10.0.0.1", true)
					p.Labels = map[string]string{"app": "other"}
					f.update(p)
				}, want: []Engine{aGone}},
				{name: "grace runs out", do: func(f *fixture) { f.awaitTimer("relabel"); f.clock.Step(grace) }, want: []Engine{}},
			},
		},
		{
			name: "pending pod without IP is ignored until Running",
			steps: []step{
				{name: "initial list: none", do: func(*fixture) {}, want: []Engine{}},
				{name: "pending", noReport: true, do: func(f *fixture) { f.create(pod("vllm-a", "", false)) }},
				{name: "running, not ready: followed", do: func(f *fixture) { f.update(pod("vllm-a", "10.0.0.1", false)) }, want: []Engine{engine("vllm-a", "10.0.0.1", false)}},
				{name: "ready", do: func(f *fixture) { f.update(pod("vllm-a", "10.0.0.1", true)) }, want: []Engine{a}},
			},
		},
		{
			name:    "IP change replaces at once",
			initial: []*corev1.Pod{pod("vllm-a", "10.0.0.1", true)},
			steps: []step{
				{name: "initial list", do: func(*fixture) {}, want: []Engine{a}},
				{name: "new IP", do: func(f *fixture) { f.update(pod("vllm-a", "10.0.0.7", true)) }, want: []Engine{engine("vllm-a", "10.0.0.7", true)}},
			},
		},
		{
			name:    "a pod back within its grace period stays",
			initial: []*corev1.Pod{pod("vllm-a", "10.0.0.1", true), pod("vllm-b", "10.0.0.2", true)},
			steps: []step{
				{name: "initial list", do: func(*fixture) {}, want: []Engine{a, b}},
				{name: "failed", do: func(f *fixture) {
					p := pod("vllm-a", "10.0.0.1", false)
					p.Status.Phase = corev1.PodFailed
					f.update(p)
				}, want: []Engine{aGone, b}},
				{name: "most of the grace passes", noReport: true, do: func(f *fixture) {
					f.awaitTimer("failed")
					f.clock.Step(grace - time.Second)
				}},
				{name: "running again", do: func(f *fixture) { f.update(pod("vllm-a", "10.0.0.1", true)) }, want: []Engine{a, b}},
				{name: "the old grace's end passes", noReport: true, do: func(f *fixture) { f.clock.Step(2 * time.Second) }},
				{name: "b deleted: a is still there", do: func(f *fixture) { f.delete("vllm-b") }, want: []Engine{a, {Name: "vllm-b", IP: "10.0.0.2", Model: "llama", Ranks: 1}}},
			},
		},
		{
			name:    "terminating pod goes into its grace period",
			initial: []*corev1.Pod{pod("vllm-a", "10.0.0.1", true)},
			steps: []step{
				{name: "initial list", do: func(*fixture) {}, want: []Engine{a}},
				{name: "deletion timestamp", do: func(f *fixture) {
					p := pod("vllm-a", "10.0.0.1", true)
					p.DeletionTimestamp = &metav1.Time{Time: time.Unix(1_700_000_000, 0)}
					f.update(p)
				}, want: []Engine{aGone}},
				{name: "grace runs out", do: func(f *fixture) { f.awaitTimer("terminating"); f.clock.Step(grace) }, want: []Engine{}},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, Config{}, tc.initial...)
			for _, s := range tc.steps {
				n := f.count()
				s.do(f)
				if s.noReport {
					if got := f.count(); got != n {
						t.Fatalf("%s: a set was reported (%d, was %d)", s.name, got, n)
					}
					continue
				}
				f.awaitSet(s.name, s.want)
			}
		})
	}
}

// Reports only follow changes: the informer's resyncs (every pod again)
// and updates that change nothing an engine is made of report nothing.
func TestWatcherIdempotent(t *testing.T) {
	a := engine("vllm-a", "10.0.0.1", true)
	// The informer resyncs at most once a second.
	f := newFixture(t, Config{Resync: time.Second}, pod("vllm-a", "10.0.0.1", true))
	f.awaitSet("initial list", []Engine{a})
	rounds := f.w.rounds.Load()
	p := pod("vllm-a", "10.0.0.1", true)
	p.Annotations = map[string]string{"touched": "yes"}
	f.update(p)
	f.await("the update and two resyncs handled", func() bool { return f.w.rounds.Load() >= rounds+3 })
	if n := f.count(); n != 1 {
		t.Errorf("%d sets reported, want 1 (the initial list's)", n)
	}
	if got := f.w.Engines(); !slices.Equal(got, []Engine{a}) {
		t.Errorf("Engines() = %+v, want %+v", got, []Engine{a})
	}
}

// The grace period ends exactly at Grace after the pod went away: one
// step short, it is still there.
func TestWatcherGraceBoundary(t *testing.T) {
	f := newFixture(t, Config{}, pod("vllm-a", "10.0.0.1", false))
	f.awaitSet("initial list", []Engine{engine("vllm-a", "10.0.0.1", false)})
	f.delete("vllm-a")
	// Not Ready already: going away changes nothing reported until the
	// grace ends; the armed timer says the Watcher saw it.
	f.awaitTimer("delete")
	f.clock.Step(grace - time.Nanosecond)
	if !f.clock.HasWaiters() || f.count() != 1 {
		t.Fatalf("dropped before the grace ran out (%d sets reported)", f.count())
	}
	f.clock.Step(time.Nanosecond)
	f.awaitSet("grace over", []Engine{})
}

// Ranks and a negative grace (drop at once) reach the engines.
func TestWatcherConfig(t *testing.T) {
	f := newFixture(t, Config{Ranks: 2, Grace: -1}, pod("vllm-a", "10.0.0.1", true))
	want := engine("vllm-a", "10.0.0.1", true)
	want.Ranks = 2
	f.awaitSet("initial list", []Engine{want})
	f.delete("vllm-a")
	f.awaitSet("deleted, no grace", []Engine{})
}

func TestNewErrors(t *testing.T) {
	client := DynamicPods(newCluster(t))
	ok := func([]Engine) {}
	tests := []struct {
		name string
		cfg  Config
	}{
		{"no namespace", Config{Selector: selector}},
		{"no selector", Config{Namespace: ns}},
		{"blank selector", Config{Namespace: ns, Selector: "  "}},
		{"bad selector", Config{Namespace: ns, Selector: "=vllm"}},
		{"bad selector value", Config{Namespace: ns, Selector: "app in (a"}},
		{"negative ranks", Config{Namespace: ns, Selector: selector, Ranks: -1}},
		{"negative resync", Config{Namespace: ns, Selector: selector, Resync: -time.Second}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := New(client, tc.cfg, ok); err == nil {
				t.Errorf("New(%+v): no error", tc.cfg)
			}
		})
	}
	if _, err := New(nil, Config{Namespace: ns, Selector: selector}, ok); err == nil {
		t.Error("New without a client: no error")
	}
	if _, err := New(client, Config{Namespace: ns, Selector: selector}, nil); err == nil {
		t.Error("New without a callback: no error")
	}
}

// Without a cluster or a kubeconfig, NewClient says so.
func TestNewClientNeitherInClusterNorKubeconfig(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	t.Setenv("KUBERNETES_SERVICE_PORT", "")
	t.Setenv("KUBECONFIG", "")
	t.Setenv("HOME", t.TempDir())
	_, _, err := NewClient()
	if err == nil || !strings.Contains(err.Error(), "not in a cluster") || !strings.Contains(err.Error(), "KUBECONFIG") {
		t.Fatalf("error %v, want one saying there is neither a cluster nor a kubeconfig", err)
	}
}

// A kubeconfig gives the client and its context's namespace.
func TestNewClientKubeconfig(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config")
	const cfg = `apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://127.0.0.1:6443"}
users:
- name: u
  user: {token: "x"}
contexts:
- name: ctx
  context: {cluster: c, user: u, namespace: llm}
current-context: ctx
`
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("KUBECONFIG", path)
	client, gotNS, err := NewClient()
	if err != nil || client == nil || gotNS != "llm" {
		t.Fatalf("NewClient() = %v, %q, %v; want a client for namespace llm", client, gotNS, err)
	}
}

// newCluster is a fake API server holding pods, for DynamicPods.
func newCluster(t *testing.T, pods ...*corev1.Pod) *dynamicfake.FakeDynamicClient {
	t.Helper()
	objs := make([]runtime.Object, len(pods))
	for i, p := range pods {
		objs[i] = unstructuredPod(t, p)
	}
	return dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{podsResource: "PodList"}, objs...)
}
