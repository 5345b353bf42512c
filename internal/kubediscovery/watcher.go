package kubediscovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	listersv1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"
)

// Defaults; each is written here only.
const (
	// DefaultGrace is how long a pod that went away stays an engine.
	DefaultGrace = 30 * time.Second
	// DefaultResync is how often the informer re-delivers every pod it
	// holds. The Watcher compares whole sets, so a resync changes nothing
	// unless an event was lost.
	DefaultResync = 10 * time.Minute
)

// syncWarning is how long the initial list may take before the Watcher
// warns that it has not completed.
const syncWarning = 30 * time.Second

// Config configures a Watcher.
type Config struct {
	// Namespace is the namespace watched; required (NewClient returns
	// the default one).
	Namespace string
	// Selector is the label selector the pods must match, e.g.
	// "app=vllm,model=llama"; required: a namespace's every pod is
	// hardly a fleet of engines.
	Selector string
	// ModelLabel, if set, is the label whose value is the engine's
	// model (Engine.Model; "" when the pod lacks it).
	ModelLabel string
	// Ranks is each engine's data-parallel size (0 means 1).
	Ranks int
	// Grace is how long a pod that went away stays an engine
	// (DefaultGrace if 0; negative: dropped at once).
	Grace time.Duration
	// Resync is the informer's resync period (DefaultResync if 0).
	Resync time.Duration
	// Clock times the grace period (the real clock if nil).
	Clock clock.WithTicker
	// Logger; slog.Default if nil.
	Logger *slog.Logger
}

// Engine is one pod followed as an engine.
type Engine struct {
	// Name is the pod's name: the engine's name in the index.
	Name string
	// IP is the pod's IP (status.podIP), the engine's identity.
	IP string
	// Model is the value of Config.ModelLabel ("" without one).
	Model string
	// Ranks is the engine's data-parallel size (Config.Ranks, at least 1).
	Ranks int
	// Ready: the pod is Ready and has not gone away. A pod within its
	// grace period after going away is still listed, not Ready.
	Ready bool
}

// tracked is a pod the Watcher follows; goneAt is when it went away
// (zero while it is present).
type tracked struct {
	Engine
	goneAt time.Time
}

// Watcher follows the pods Config selects. Build it with New, run it
// with Run.
type Watcher struct {
	cfg      Config
	sel      labels.Selector
	clk      clock.WithTicker
	log      *slog.Logger
	lister   listersv1.PodLister
	stopped  sync.WaitGroup // the informer's goroutine
	informer cache.SharedIndexInformer
	onChange func([]Engine)

	dirty chan struct{} // a pod changed: recompute (capacity 1)

	mu   sync.Mutex
	pods map[string]*tracked // by pod name; read and written by the run loop, read by Engines
	last []Engine            // the set last reported
	sent bool                // a set was reported (the first, even empty, always is)

	rounds atomic.Int64 // recomputations done, for tests
}

// New builds a Watcher over client (see PodClient). onChange receives the whole set of
// engines (sorted by name) each time it changes, first once the
// informer's initial list is in; it is called from one goroutine at a
// time and must not block for long.
func New(client PodClient, cfg Config, onChange func([]Engine)) (*Watcher, error) {
	if client == nil {
		return nil, errors.New("kubediscovery: no Kubernetes client")
	}
	if onChange == nil {
		return nil, errors.New("kubediscovery: no change callback")
	}
	if cfg.Namespace == "" {
		return nil, errors.New("kubediscovery: no namespace")
	}
	if strings.TrimSpace(cfg.Selector) == "" {
		return nil, errors.New("kubediscovery: no label selector (every pod of the namespace is hardly a fleet of engines)")
	}
	sel, err := labels.Parse(cfg.Selector)
	if err != nil {
		return nil, fmt.Errorf("kubediscovery: label selector %q: %w", cfg.Selector, err)
	}
	if cfg.Ranks < 0 {
		return nil, fmt.Errorf("kubediscovery: ranks %d: want at least 1 (or 0 for 1)", cfg.Ranks)
	}
	if cfg.Resync < 0 {
		return nil, fmt.Errorf("kubediscovery: negative resync period %v", cfg.Resync)
	}
	cfg.Ranks = max(cfg.Ranks, 1)
	if cfg.Grace == 0 {
		cfg.Grace = DefaultGrace
	}
	if cfg.Resync == 0 {
		cfg.Resync = DefaultResync
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	selector := sel.String()
	pods := client.Pods(cfg.Namespace)
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = selector
			return pods.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = selector
			return pods.Watch(ctx, o)
		},
	}
	informer := cache.NewSharedIndexInformer(cache.ToListWatcherWithWatchListSemantics(lw, listThenWatch{}), &corev1.Pod{}, cfg.Resync,
		cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	w := &Watcher{
		cfg: cfg, sel: sel, clk: cfg.Clock, log: cfg.Logger,
		lister: listersv1.NewPodLister(informer.GetIndexer()), informer: informer,
		onChange: onChange,
		dirty:    make(chan struct{}, 1),
		pods:     map[string]*tracked{},
	}
	// The handlers only mark the set dirty: the run loop reads the
	// informer's store whole, so resyncs and repeated events are no-ops.
	mark := func() {
		select {
		case w.dirty <- struct{}{}:
		default:
		}
	}
	if _, err := w.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { mark() },
		UpdateFunc: func(any, any) { mark() },
		DeleteFunc: func(any) { mark() },
	}); err != nil {
		return nil, fmt.Errorf("kubediscovery: %w", err)
	}
	return w, nil
}

// Run follows the pods until ctx ends. It returns an error if the
// informer's initial list does not complete (ctx ended first: the API
// server refused or was not reached; client-go logs why).
func (w *Watcher) Run(ctx context.Context) error {
	w.stopped.Add(1)
	go func() {
		defer w.stopped.Done()
		w.informer.RunWithContext(ctx)
	}()
	defer w.stopped.Wait()
	// An API server that refuses the list (RBAC) or cannot be reached
	// leaves the informer retrying; say so in this log, not only in
	// client-go's.
	slow := w.clk.NewTimer(syncWarning)
	synced := make(chan struct{})
	go func() {
		select {
		case <-slow.C():
			w.log.Warn("kubediscovery: the initial list of pods has not completed; can kvindex reach the API server, and get, list and watch pods there?",
				"namespace", w.cfg.Namespace, "selector", w.cfg.Selector, "after", syncWarning.String())
		case <-synced:
		}
	}()
	ok := cache.WaitForCacheSync(ctx.Done(), w.informer.HasSynced)
	slow.Stop()
	close(synced)
	if !ok {
		return fmt.Errorf("kubediscovery: pods of namespace %s matching %q: the initial list did not complete", w.cfg.Namespace, w.cfg.Selector)
	}
	w.log.Info("kubediscovery: following pods", "namespace", w.cfg.Namespace, "selector", w.cfg.Selector, "grace", w.cfg.Grace.String())
	timer := w.clk.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	armed := false
	for {
		next := w.recompute()
		if armed {
			timer.Stop()
			armed = false
		}
		if !next.IsZero() {
			timer.Reset(max(next.Sub(w.clk.Now()), 0))
			armed = true
		}
		select {
		case <-ctx.Done():
			return nil
		case <-w.dirty:
		case <-timer.C():
			armed = false
		}
	}
}

// Engines returns the set last reported.
func (w *Watcher) Engines() []Engine {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.last)
}

// recompute compares the informer's pods with the engines followed,
// reports the set if it changed, and returns when the next departed
// pod's grace runs out (zero if none is pending).
func (w *Watcher) recompute() time.Time {
	defer w.rounds.Add(1)
	now := w.clk.Now()
	pods, err := w.lister.List(w.sel)
	if err != nil {
		// The store's List fails only on a bad selector, checked in New.
		w.log.Error("kubediscovery: listing the informer's pods", "err", err)
		return time.Time{}
	}
	present := make(map[string]Engine, len(pods))
	for _, p := range pods {
		if e, ok := w.engineOf(p); ok {
			present[e.Name] = e
		}
	}
	w.mu.Lock()
	for name, e := range present {
		t, ok := w.pods[name]
		switch {
		case !ok:
			w.log.Info("kubediscovery: pod found", "pod", name, "ip", e.IP, "ready", e.Ready)
		case t.IP != e.IP:
			// The IP is the identity: the old address is not this
			// engine any more, so no grace.
			w.log.Info("kubediscovery: pod IP changed", "pod", name, "from", t.IP, "to", e.IP)
		case !t.goneAt.IsZero():
			w.log.Info("kubediscovery: pod back within its grace period", "pod", name, "ip", e.IP)
		}
		w.pods[name] = &tracked{Engine: e}
	}
	var next time.Time
	for name, t := range w.pods {
		if _, ok := present[name]; ok {
			continue
		}
		if t.goneAt.IsZero() {
			t.goneAt, t.Ready = now, false
			w.log.Info("kubediscovery: pod gone; dropped after the grace period", "pod", name, "ip", t.IP, "grace", w.cfg.Grace.String())
		}
		end := t.goneAt.Add(w.cfg.Grace)
		if !now.Before(end) {
			delete(w.pods, name)
			w.log.Info("kubediscovery: pod dropped", "pod", name, "ip", t.IP)
			continue
		}
		if next.IsZero() || end.Before(next) {
			next = end
		}
	}
	set := make([]Engine, 0, len(w.pods))
	for _, t := range w.pods {
		set = append(set, t.Engine)
	}
	slices.SortFunc(set, func(a, b Engine) int { return strings.Compare(a.Name, b.Name) })
	changed := !w.sent || !slices.Equal(set, w.last)
	if changed {
		w.last, w.sent = set, true
	}
	w.mu.Unlock()
	if changed {
		w.onChange(slices.Clone(set))
	}
	return next
}

// engineOf is the engine a pod is, if it is one: Running, with an IP,
// not being deleted, and matching the selector (the API server filters
// too; this keeps a pod whose labels changed out whatever the watch
// delivers).
func (w *Watcher) engineOf(p *corev1.Pod) (Engine, bool) {
	if p.Status.Phase != corev1.PodRunning || p.Status.PodIP == "" || p.DeletionTimestamp != nil ||
		!w.sel.Matches(labels.Set(p.Labels)) {
		return Engine{}, false
	}
	e := Engine{Name: p.Name, IP: p.Status.PodIP, Ranks: w.cfg.Ranks}
	if w.cfg.ModelLabel != "" {
		e.Model = p.Labels[w.cfg.ModelLabel]
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			e.Ready = c.Status == corev1.ConditionTrue
		}
	}
	return e, true
}

// listThenWatch makes the informer list, then watch, rather than stream
// the initial list through a watch (client-go's watch-list), which the
// fake clients do not serve and a selector's few pods do not need.
type listThenWatch struct{}

func (listThenWatch) IsWatchListSemanticsUnSupported() bool { return true }
