package kubernetes

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/testutil"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// monitor is a Prometheus Operator ServiceMonitor or PodMonitor
// (monitoring.coreos.com/v1), which k8s.io/api does not have: only the
// fields the components here use, so that strict decoding still refuses
// a misspelt or misplaced one.
type monitor struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   metav1.ObjectMeta `json:"metadata"`
	Spec       struct {
		Selector          metav1.LabelSelector `json:"selector"`
		NamespaceSelector *struct {
			Any        bool     `json:"any,omitempty"`
			MatchNames []string `json:"matchNames,omitempty"`
		} `json:"namespaceSelector,omitempty"`
		// Endpoints name Service ports (ServiceMonitor);
		// PodMetricsEndpoints name container ports (PodMonitor).
		Endpoints           []monitorEndpoint `json:"endpoints,omitempty"`
		PodMetricsEndpoints []monitorEndpoint `json:"podMetricsEndpoints,omitempty"`
	} `json:"spec"`
}

type monitorEndpoint struct {
	Port     string `json:"port,omitempty"`
	Path     string `json:"path,omitempty"`
	Interval string `json:"interval,omitempty"`
}

func (m *monitor) deepCopy() *monitor {
	j, err := json.Marshal(m)
	if err != nil {
		panic(err) // a struct of plain fields always marshals
	}
	out := &monitor{}
	if err := json.Unmarshal(j, out); err != nil {
		panic(err)
	}
	return out
}

// selects reports whether sel matches set; an invalid selector matches
// nothing.
func selects(sel *metav1.LabelSelector, set map[string]string) bool {
	s, err := metav1.LabelSelectorAsSelector(sel)
	return err == nil && !s.Empty() && s.Matches(labels.Set(set))
}

// hasPort reports whether one of containers declares port, by name or
// number.
func hasPort(containers []corev1.Container, port intstr.IntOrString) bool {
	for _, c := range containers {
		for _, p := range c.Ports {
			if (port.Type == intstr.String && p.Name == port.StrVal) || (port.Type == intstr.Int && p.ContainerPort == port.IntVal) {
				return true
			}
		}
	}
	return false
}

// wiringProblems checks that the objects of a build refer to each other:
// each Service, disruption budget and monitor selects pods that exist,
// on ports they have, and each probe and spread constraint points at its
// own pod.
func wiringProblems(r rendered) []string {
	var out []string
	add := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }
	podsOf := func(sel *metav1.LabelSelector) []*appsv1.Deployment {
		var ds []*appsv1.Deployment
		for _, d := range r.deployments {
			if selects(sel, d.Spec.Template.Labels) {
				ds = append(ds, d)
			}
		}
		return ds
	}
	for _, s := range r.services {
		ds := podsOf(&metav1.LabelSelector{MatchLabels: s.Spec.Selector})
		if len(ds) == 0 {
			add("Service %s: selector %v matches no pod template", s.Name, s.Spec.Selector)
		}
		for _, p := range s.Spec.Ports {
			target := p.TargetPort
			if target.Type == intstr.Int && target.IntVal == 0 {
				target = intstr.FromInt32(p.Port)
			}
			for _, d := range ds {
				if !hasPort(d.Spec.Template.Spec.Containers, target) {
					add("Service %s: port %s targetPort %s is no container port of Deployment %s", s.Name, p.Name, target.String(), d.Name)
				}
			}
		}
	}
	for _, d := range r.deployments {
		pod := &d.Spec.Template
		for _, c := range slices.Concat(pod.Spec.InitContainers, pod.Spec.Containers) {
			for kind, pr := range map[string]*corev1.Probe{"startup": c.StartupProbe, "readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
				if port, ok := probePort(pr); ok && !hasPort([]corev1.Container{c}, port) {
					add("Deployment %s: container %s: %s probe port %s is not one of the container's ports", d.Name, c.Name, kind, port.String())
				}
			}
		}
		for i, tsc := range pod.Spec.TopologySpreadConstraints {
			if tsc.LabelSelector == nil || !selects(tsc.LabelSelector, pod.Labels) {
				add("Deployment %s: topologySpreadConstraints[%d]: selector %s does not match its own pods, so it spreads nothing", d.Name, i, metav1.FormatLabelSelector(tsc.LabelSelector))
			}
		}
		if a := pod.Spec.Affinity; a != nil && a.PodAntiAffinity != nil {
			terms := a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution
			for _, w := range a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution {
				terms = append(terms, w.PodAffinityTerm)
			}
			for i, term := range terms {
				if term.LabelSelector == nil || !selects(term.LabelSelector, pod.Labels) {
					add("Deployment %s: podAntiAffinity term %d: selector does not match its own pods", d.Name, i)
				}
			}
		}
	}
	for _, b := range r.budgets {
		if len(podsOf(b.Spec.Selector)) == 0 {
			add("PodDisruptionBudget %s: selector %s matches no pod template", b.Name, metav1.FormatLabelSelector(b.Spec.Selector))
		}
	}
	for _, m := range r.monitors {
		switch m.Kind {
		case "ServiceMonitor":
			var svcs []*corev1.Service
			for _, s := range r.services {
				if selects(&m.Spec.Selector, s.Labels) {
					svcs = append(svcs, s)
				}
			}
			if len(svcs) == 0 || len(m.Spec.Endpoints) == 0 {
				add("ServiceMonitor %s: selector %s matches no Service's labels, or it has no endpoints", m.Metadata.Name, metav1.FormatLabelSelector(&m.Spec.Selector))
			}
			for _, e := range m.Spec.Endpoints {
				for _, s := range svcs {
					if !slices.ContainsFunc(s.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == e.Port }) {
						add("ServiceMonitor %s: port %q is no port of Service %s", m.Metadata.Name, e.Port, s.Name)
					}
				}
			}
		case "PodMonitor":
			ds := podsOf(&m.Spec.Selector)
			if len(ds) == 0 || len(m.Spec.PodMetricsEndpoints) == 0 {
				add("PodMonitor %s: selector %s matches no pod template, or it has no endpoints", m.Metadata.Name, metav1.FormatLabelSelector(&m.Spec.Selector))
			}
			for _, e := range m.Spec.PodMetricsEndpoints {
				if !slices.ContainsFunc(ds, func(d *appsv1.Deployment) bool {
					return hasPort(d.Spec.Template.Spec.Containers, intstr.FromString(e.Port))
				}) {
					add("PodMonitor %s: port %q is no container port of the pods it selects", m.Metadata.Name, e.Port)
				}
			}
		}
	}
	return out
}

// probePort is the port a probe connects to, if it has one.
func probePort(p *corev1.Probe) (intstr.IntOrString, bool) {
	switch {
	case p == nil:
	case p.HTTPGet != nil:
		return p.HTTPGet.Port, true
	case p.TCPSocket != nil:
		return p.TCPSocket.Port, true
	case p.GRPC != nil:
		return intstr.FromInt32(p.GRPC.Port), true
	}
	return intstr.IntOrString{}, false
}

// minStartup is the least time the replicas' startup probe must allow: a
// start restores the latest snapshot and reads the stream from there
// before it is live, which takes minutes for a large fleet (README.md,
// "NATS mode: capacity").
const minStartup = 5 * time.Minute

// replicaProblems checks what keeps kvindex answering while replicas come
// and go (NATS mode): several replicas, a rollout that waits for a caught-up
// replacement, probes that tell caught up from alive, a disruption budget
// that lets a drain proceed one replica at a time, and replicas spread
// over nodes.
func replicaProblems(r rendered) []string {
	var out []string
	add := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }
	d, ok := find(r.deployments, "kvindex", func(d *appsv1.Deployment) string { return d.Name })
	if !ok {
		return []string{"no Deployment named kvindex"}
	}
	replicas := 1
	if d.Spec.Replicas != nil {
		replicas = int(*d.Spec.Replicas)
	}
	if replicas < 2 {
		add("Deployment kvindex: replicas %d; run at least 2, so that one answers while another restarts", replicas)
	}
	st := d.Spec.Strategy
	if ru := st.RollingUpdate; st.Type != appsv1.RollingUpdateDeploymentStrategyType || ru == nil ||
		scaled(ru.MaxUnavailable, replicas, false) != 0 || scaled(ru.MaxSurge, replicas, true) < 1 {
		add("Deployment kvindex: strategy %s; want RollingUpdate with maxUnavailable 0 and maxSurge 1, so no replica leaves before its replacement is ready", st.Type)
	}
	c, ok := find(d.Spec.Template.Spec.Containers, "kvindex", func(c corev1.Container) string { return c.Name })
	if !ok {
		return append(out, "Deployment kvindex: no container named kvindex")
	}
	for _, p := range []struct {
		kind, path string
		probe      *corev1.Probe
	}{{"readiness", "/readyz", c.ReadinessProbe}, {"liveness", "/healthz", c.LivenessProbe}, {"startup", "/healthz", c.StartupProbe}} {
		if p.probe == nil || p.probe.HTTPGet == nil || p.probe.HTTPGet.Path != p.path {
			add("Deployment kvindex: the %s probe is not an HTTP GET of %s", p.kind, p.path)
		}
	}
	if s := c.StartupProbe; s != nil {
		period, failures := max(s.PeriodSeconds, 10), max(s.FailureThreshold, 3) // the API's defaults
		if allowed := time.Duration(period*failures) * time.Second; allowed < minStartup {
			add("Deployment kvindex: the startupProbe allows %v (periodSeconds x failureThreshold); a snapshot restore and catch-up needs at least %v", allowed, minStartup)
		}
	}
	var budgets []*policyv1.PodDisruptionBudget
	for _, b := range r.budgets {
		if selects(b.Spec.Selector, d.Spec.Template.Labels) {
			budgets = append(budgets, b)
		}
	}
	if len(budgets) != 1 {
		add("Deployment kvindex: %d PodDisruptionBudgets select its pods; want one", len(budgets))
	}
	for _, b := range budgets {
		// The evictions a drain may make at once: at least one (or the
		// drain never ends), fewer than all (or nothing answers).
		allowed := -1
		switch {
		case b.Spec.MaxUnavailable != nil && b.Spec.MinAvailable == nil:
			allowed = scaled(b.Spec.MaxUnavailable, replicas, true)
		case b.Spec.MinAvailable != nil && b.Spec.MaxUnavailable == nil:
			allowed = replicas - scaled(b.Spec.MinAvailable, replicas, true)
		}
		if allowed < 1 || allowed >= replicas {
			add("PodDisruptionBudget %s: allows %d of %d replicas to be evicted at once; want at least one and fewer than all", b.Name, allowed, replicas)
		}
	}
	spec := d.Spec.Template.Spec
	if len(spec.TopologySpreadConstraints) == 0 && (spec.Affinity == nil || spec.Affinity.PodAntiAffinity == nil) {
		add("Deployment kvindex: no topology spread or pod anti-affinity: replicas may share a node")
	}
	return out
}

// scaled is an int-or-percent of total, -1 if it does not parse.
func scaled(v *intstr.IntOrString, total int, roundUp bool) int {
	if v == nil {
		return -1
	}
	n, err := intstr.GetScaledValueFromIntOrPercent(v, total, roundUp)
	if err != nil {
		return -1
	}
	return n
}

// memoryProblem says why c's memory limit cannot hold a kvindex with
// memory-budget budget, or "": README.md ("Reliability") bounds the
// process by the budget + 10% + 48 MiB.
func memoryProblem(budget string, c corev1.Container) string {
	if budget == "" {
		return ""
	}
	b, err := testutil.ParseSize(budget)
	if err != nil {
		return "memory-budget " + budget + ": " + err.Error()
	}
	need := b + b/10 + 48<<20
	if lim := c.Resources.Limits.Memory(); lim.IsZero() || lim.Value() < need {
		return fmt.Sprintf("memory limit %s is below memory-budget %s + 10%% + 48 MiB (%d B)", lim, budget, need)
	}
	return ""
}

// relayContainer is the relay sidecar's container name.
const relayContainer = "kvindex-relay"

// kvEventsConfig is the part of vLLM's --kv-events-config the relay
// depends on.
type kvEventsConfig struct {
	Enabled        bool   `json:"enable_kv_cache_events"`
	Publisher      string `json:"publisher"`
	Endpoint       string `json:"endpoint"`
	ReplayEndpoint string `json:"replay_endpoint"`
	Topic          string `json:"topic"`
}

// varRef is a $(VAR) reference, which the kubelet expands in args from the
// container's own env.
var varRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// relayProblems checks every relay sidecar against the engine beside it:
// the engine binds what the relay dials, on every data-parallel rank's
// ports; both name the same pod and model; the relay's metrics port is a
// container port and does not gate the engine's readiness.
func relayProblems(r rendered, b build) []string {
	var out []string
	found := false
	for _, d := range r.deployments {
		pod := &d.Spec.Template
		relay, ok := find(pod.Spec.Containers, relayContainer, func(c corev1.Container) string { return c.Name })
		if !ok {
			continue
		}
		found = true
		for _, p := range relayPodProblems(pod, relay) {
			out = append(out, "Deployment "+d.Name+": "+p)
		}
	}
	if b.relay && !found {
		out = append(out, "no Deployment has a "+relayContainer+" container")
	}
	return out
}

func relayPodProblems(pod *corev1.PodTemplateSpec, relay corev1.Container) []string {
	var out []string
	add := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }

	// The engine: the container with a --kv-events-config.
	var engine corev1.Container
	var ev kvEventsConfig
	ranks := 1
	engineFlags := map[string]string{}
	for _, c := range pod.Spec.Containers {
		f, _ := parseFlags(c.Args)
		if v, ok := f["kv-events-config"]; ok {
			engine, engineFlags = c, f
			if err := json.Unmarshal([]byte(v), &ev); err != nil {
				return []string{"container " + c.Name + ": --kv-events-config: " + err.Error()}
			}
		}
	}
	if engine.Name == "" {
		return []string{"no container beside the relay has a --kv-events-config"}
	}
	if v, ok := engineFlags["data-parallel-size"]; ok {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return []string{"container " + engine.Name + ": --data-parallel-size " + v}
		}
		ranks = n
	}
	if !ev.Enabled || ev.Publisher != "zmq" {
		add("container %s: --kv-events-config: enable_kv_cache_events %v, publisher %q; the relay reads the zmq publisher", engine.Name, ev.Enabled, ev.Publisher)
	}
	// vLLM binds an endpoint with "*" and connects to any other; the relay
	// connects, so the engine must bind, or nothing flows.
	for _, ep := range []string{ev.Endpoint, ev.ReplayEndpoint} {
		if !strings.HasPrefix(ep, "tcp://*:") {
			add("container %s: --kv-events-config endpoint %q: the engine must bind (tcp://*:PORT) for the relay beside it to connect", engine.Name, ep)
		}
	}

	flags, rest := parseFlags(relay.Args)
	if len(rest) == 0 || rest[0] != "relay" {
		add("container %s: args %v do not run `kvindex relay`", relay.Name, relay.Args)
	}
	name, spec, _ := strings.Cut(flags["engine"], "=")
	parts := strings.Split(spec, ",")
	events, replay, relayRanks := parts[0], "", 1
	for _, p := range parts[1:] {
		k, v, _ := strings.Cut(p, "=")
		switch k {
		case "replay":
			replay = v
		case "ranks":
			n, err := strconv.Atoi(v)
			if err != nil {
				n = -1
			}
			relayRanks = n
		}
	}
	if relayRanks != ranks {
		add("container %s: --engine ranks=%d, the engine runs --data-parallel-size %d: rank r publishes on port+r, and the relay reads only the ranks it is given", relay.Name, relayRanks, ranks)
	}
	evPort, rpPort := portNumber(ev.Endpoint), portNumber(ev.ReplayEndpoint)
	for _, ep := range []struct{ what, relay, engine string }{{"event", events, ev.Endpoint}, {"replay", replay, ev.ReplayEndpoint}} {
		host := hostOf(ep.relay)
		if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
			add("container %s: --engine %s endpoint %q: the engine is in the same pod; use loopback", relay.Name, ep.what, ep.relay)
		}
		if portNumber(ep.relay) != portNumber(ep.engine) || portNumber(ep.relay) < 0 {
			add("container %s: --engine %s port of %q is not the engine's %s port (%s)", relay.Name, ep.what, ep.relay, ep.what, ep.engine)
		}
	}
	// Rank r uses event port +r and replay port +r: the two ranges must
	// not meet.
	if evPort >= 0 && rpPort >= 0 && evPort < rpPort+ranks && rpPort < evPort+ranks {
		add("container %s: event ports %d-%d and replay ports %d-%d overlap for %d ranks: put the replay port at least --data-parallel-size above", engine.Name, evPort, evPort+ranks-1, rpPort, rpPort+ranks-1, ranks)
	}
	if flags["model"] == "" || flags["model"] != engineFlags["model"] {
		add("container %s: --model %q, the engine serves %q", relay.Name, flags["model"], engineFlags["model"])
	}
	if ev.Topic != "" && !strings.HasSuffix(ev.Topic, "@"+engineFlags["model"]) {
		add("container %s: --kv-events-config topic %q does not name the model %q", engine.Name, ev.Topic, engineFlags["model"])
	}
	if flags["nats"] == "" {
		add("container %s: no --nats", relay.Name)
	}
	// The engine is named by its pod: the relay's name for it must be the
	// pod's name, from the downward API.
	if m := varRef.FindStringSubmatch(name); m == nil || m[0] != name || fieldRefOf(relay, m[1]) != "metadata.name" {
		add("container %s: --engine name %q: want $(VAR) with VAR the pod's name (fieldRef metadata.name)", relay.Name, name)
	}
	for _, c := range []corev1.Container{engine, relay} {
		for _, a := range c.Args {
			for _, m := range varRef.FindAllStringSubmatch(a, -1) {
				if !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == m[1] }) {
					add("container %s: %s is not in its env, so the kubelet leaves it unexpanded", c.Name, m[0])
				}
			}
		}
	}
	httpAddr := flags["http-addr"]
	if httpAddr == "" {
		httpAddr = ":9300" // the relay's default
	}
	if p, err := strconv.Atoi(portOf(httpAddr)); err != nil || !hasPort([]corev1.Container{relay}, intstr.FromInt32(int32(p))) {
		add("container %s: --http-addr %s is not one of its container ports", relay.Name, httpAddr)
	}
	if relay.LivenessProbe == nil {
		add("container %s: no livenessProbe", relay.Name)
	}
	// The pod's readiness is the engine's: a relay probe would take the
	// engine out of its Service whenever NATS is away.
	if relay.ReadinessProbe != nil {
		add("container %s: a readinessProbe would make the engine unready whenever NATS is", relay.Name)
	}
	uid, err := dockerfileUser("../Dockerfile")
	if err != nil {
		add("%v", err)
	} else if u := runAsUser(pod.Spec, relay); u == nil || *u != uid {
		add("container %s: runAsUser %v, the kvindex image's user is %d", relay.Name, deref(u), uid)
	}
	return out
}

// portNumber is the port of an endpoint, or -1.
func portNumber(ep string) int {
	n, err := strconv.Atoi(portOf(ep))
	if err != nil || n <= 0 {
		return -1
	}
	return n
}

// hostOf is the host of an endpoint "tcp://HOST:PORT".
func hostOf(ep string) string {
	_, hp, _ := strings.Cut(ep, "://")
	host, _, err := net.SplitHostPort(hp)
	if err != nil {
		return ""
	}
	return host
}

// fieldRefOf is the downward-API field env var name of c comes from.
func fieldRefOf(c corev1.Container, name string) string {
	for _, e := range c.Env {
		if e.Name == name && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
			return e.ValueFrom.FieldRef.FieldPath
		}
	}
	return ""
}

// checkFails renders b, requires it to pass, then applies each case's
// change to a copy and requires a problem mentioning want.
func checkFails(t *testing.T, b build, cases []failCase) {
	t.Helper()
	good := render(t, b)
	if p := problems(good, b); len(p) > 0 {
		t.Fatalf("%s itself has problems: %v", b.name, p)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := good.deepCopy()
			c.mutate(&r)
			got := problems(r, b)
			if !slices.ContainsFunc(got, func(p string) bool { return strings.Contains(p, c.want) }) {
				t.Errorf("problems %q, want one mentioning %q", got, c.want)
			}
		})
	}
}

type failCase struct {
	name   string
	mutate func(*rendered)
	want   string
}

func buildNamed(t *testing.T, name string) build {
	t.Helper()
	b, ok := find(builds, name, func(b build) string { return b.name })
	if !ok {
		t.Fatalf("no build %s", name)
	}
	return b
}

// Each change breaks one rule of the NATS-mode replicas.
func TestReplicaChecksFail(t *testing.T) {
	dep := func(r *rendered) *appsv1.Deployment { return r.deployments[0] }
	ctr := func(r *rendered) *corev1.Container { return &dep(r).Spec.Template.Spec.Containers[0] }
	svc := func(r *rendered) *corev1.Service { return r.services[0] }
	np := func(r *rendered) *networkingv1.NetworkPolicySpec {
		p, _ := find(r.policies, "kvindex", func(p *networkingv1.NetworkPolicy) string { return p.Name })
		return &p.Spec
	}
	checkFails(t, buildNamed(t, "replicas+prometheus+monitoring"), []failCase{
		{"one replica", func(r *rendered) { dep(r).Spec.Replicas = ptr[int32](1) }, "replicas 1"},
		{"old replica leaves first", func(r *rendered) {
			dep(r).Spec.Strategy.RollingUpdate.MaxUnavailable = ptr(intstr.FromInt32(1))
		}, "maxUnavailable 0"},
		{"recreate", func(r *rendered) {
			dep(r).Spec.Strategy = appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType}
		}, "RollingUpdate"},
		{"ready when alive", func(r *rendered) { ctr(r).ReadinessProbe.HTTPGet.Path = "/healthz" }, "readiness probe"},
		{"no startup probe", func(r *rendered) { ctr(r).StartupProbe = nil }, "startup probe"},
		{"startup probe too short", func(r *rendered) { ctr(r).StartupProbe.FailureThreshold = 6 }, "startupProbe allows 1m0s"},
		{"probe on a port the container lacks", func(r *rendered) {
			ctr(r).LivenessProbe.HTTPGet.Port = intstr.FromString("metrics")
		}, "liveness probe port metrics"},
		{"no disruption budget", func(r *rendered) { r.budgets = nil }, "0 PodDisruptionBudgets"},
		{"budget selects other pods", func(r *rendered) {
			r.budgets[0].Spec.Selector.MatchLabels = map[string]string{"app": "kvindex"}
		}, "matches no pod template"},
		{"budget blocks drains", func(r *rendered) {
			r.budgets[0].Spec.MaxUnavailable = nil
			r.budgets[0].Spec.MinAvailable = ptr(intstr.FromInt32(3))
		}, "allows 0 of 3"},
		{"budget allows all", func(r *rendered) {
			r.budgets[0].Spec.MaxUnavailable = ptr(intstr.FromString("100%"))
		}, "allows 3 of 3"},
		{"no spread", func(r *rendered) { dep(r).Spec.Template.Spec.TopologySpreadConstraints = nil }, "no topology spread"},
		{"spread over other pods", func(r *rendered) {
			dep(r).Spec.Template.Spec.TopologySpreadConstraints[0].LabelSelector.MatchLabels = map[string]string{"app": "kvindex"}
		}, "does not match its own pods"},
		{"Service selects no pod", func(r *rendered) { svc(r).Spec.Selector = map[string]string{"app": "kvindex"} }, "matches no pod template"},
		{"Service targets a missing port", func(r *rendered) {
			svc(r).Spec.Ports[0].TargetPort = intstr.FromString("grpc-api")
		}, "targetPort grpc-api"},
		{"memory limit below the budget", func(r *rendered) {
			ctr(r).Resources.Limits[corev1.ResourceMemory] = resource.MustParse("3Gi")
		}, "memory limit 3Gi"},
		{"no --nats", func(r *rendered) { ctr(r).Args = slices.DeleteFunc(ctr(r).Args, isNATSFlag) }, "--nats"},
		{"ZMQ listener too", func(r *rendered) { ctr(r).Args = append(ctr(r).Args, "--listen=tcp://*:5557") }, "NATS mode"},
		{"NATS unreachable", func(r *rendered) { np(r).Egress = np(r).Egress[1:] }, natsPeer + " refused on TCP/4222"},
		{"NATS on another port", func(r *rendered) {
			for i, a := range ctr(r).Args {
				if isNATSFlag(a) {
					ctr(r).Args[i] = "--nats=nats://nats:4223"
				}
			}
		}, natsPeer + " refused on TCP/4223"},
		{"engines admitted to an event port", func(r *rendered) {
			np(r).Ingress = append(np(r).Ingress, networkingv1.NetworkPolicyIngressRule{
				From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: engineLabels}}},
				Ports: []networkingv1.NetworkPolicyPort{{Port: ptr(intstr.FromInt32(5557))}},
			})
		}, enginePeer + " allowed on TCP/5557"},
		{"ServiceMonitor on a missing port", func(r *rendered) { r.monitors[0].Spec.Endpoints[0].Port = "metrics" }, `port "metrics"`},
		{"ServiceMonitor selects no Service", func(r *rendered) {
			r.monitors[0].Spec.Selector.MatchLabels = map[string]string{"app": "kvindex"}
		}, "matches no Service"},
	})
}

// Each change breaks one rule of the relay sidecar or its engine.
func TestRelayChecksFail(t *testing.T) {
	pod := func(r *rendered) *corev1.PodSpec { return &r.deployments[0].Spec.Template.Spec }
	engine := func(r *rendered) *corev1.Container { return &pod(r).Containers[0] }
	relay := func(r *rendered) *corev1.Container { return &pod(r).Containers[1] }
	setArg := func(c *corev1.Container, prefix, value string) {
		for i, a := range c.Args {
			if strings.HasPrefix(a, prefix) {
				c.Args[i] = prefix + value
			}
		}
	}
	kvEvents := func(r *rendered, old, new string) {
		for i, a := range engine(r).Args {
			if strings.HasPrefix(a, "--kv-events-config=") {
				engine(r).Args[i] = strings.ReplaceAll(a, old, new)
			}
		}
	}
	checkFails(t, buildNamed(t, "vllm-relay+relay-monitoring"), []failCase{
		{"fewer relay ranks than engine ranks", func(r *rendered) {
			setArg(relay(r), "--engine=", "$(POD_NAME)=tcp://127.0.0.1:5557,replay=tcp://127.0.0.1:5567,ranks=1")
		}, "ranks=1"},
		{"engine ranks raised alone", func(r *rendered) { setArg(engine(r), "--data-parallel-size=", "4") }, "--data-parallel-size 4"},
		{"relay reads another port", func(r *rendered) {
			setArg(relay(r), "--engine=", "$(POD_NAME)=tcp://127.0.0.1:5559,replay=tcp://127.0.0.1:5567,ranks=2")
		}, "event port"},
		{"relay dials another host", func(r *rendered) {
			setArg(relay(r), "--engine=", "$(POD_NAME)=tcp://10.0.0.5:5557,replay=tcp://127.0.0.1:5567,ranks=2")
		}, "loopback"},
		{"replay ports meet event ports", func(r *rendered) {
			kvEvents(r, "tcp://*:5567", "tcp://*:5558")
			setArg(relay(r), "--engine=", "$(POD_NAME)=tcp://127.0.0.1:5557,replay=tcp://127.0.0.1:5558,ranks=2")
		}, "overlap"},
		{"engine connects instead of binding", func(r *rendered) { kvEvents(r, "tcp://*:5557", "tcp://kvindex:5557") }, "must bind"},
		{"events off", func(r *rendered) { kvEvents(r, `"enable_kv_cache_events":true`, `"enable_kv_cache_events":false`) }, "enable_kv_cache_events false"},
		{"another model", func(r *rendered) { setArg(relay(r), "--model=", "Qwen/Qwen3-8B") }, "--model"},
		{"topic of another model", func(r *rendered) { kvEvents(r, "@Qwen/Qwen2.5-7B-Instruct", "@Qwen/Qwen3-8B") }, "topic"},
		{"no --nats", func(r *rendered) { relay(r).Args = slices.DeleteFunc(relay(r).Args, isNATSFlag) }, "no --nats"},
		{"engine named by a literal", func(r *rendered) {
			setArg(relay(r), "--engine=", "vllm=tcp://127.0.0.1:5557,replay=tcp://127.0.0.1:5567,ranks=2")
		}, "pod's name"},
		{"POD_NAME missing from the relay", func(r *rendered) {
			relay(r).Env = slices.DeleteFunc(relay(r).Env, func(e corev1.EnvVar) bool { return e.Name == "POD_NAME" })
		}, "$(POD_NAME) is not in its env"},
		{"POD_NAME missing from the engine", func(r *rendered) {
			engine(r).Env = slices.DeleteFunc(engine(r).Env, func(e corev1.EnvVar) bool { return e.Name == "POD_NAME" })
		}, "container vllm: $(POD_NAME)"},
		{"metrics on an undeclared port", func(r *rendered) { setArg(relay(r), "--http-addr=", ":9400") }, "--http-addr :9400"},
		{"relay gates readiness", func(r *rendered) { relay(r).ReadinessProbe = relay(r).LivenessProbe.DeepCopy() }, "readinessProbe"},
		{"relay as the engine's user", func(r *rendered) { relay(r).SecurityContext.RunAsUser = nil }, "runAsUser 1000"},
		{"relay privileged", func(r *rendered) { relay(r).SecurityContext.Capabilities = nil }, "capabilities"},
		{"relay writable root", func(r *rendered) { relay(r).SecurityContext.ReadOnlyRootFilesystem = nil }, "container kvindex-relay: readOnlyRootFilesystem"},
		{"relay image unpinned", func(r *rendered) { relay(r).Image = "kvindex" }, "no tag"},
		{"relay removed", func(r *rendered) { pod(r).Containers = pod(r).Containers[:1] }, "no Deployment has a kvindex-relay"},
		{"PodMonitor on a missing port", func(r *rendered) { r.monitors[0].Spec.PodMetricsEndpoints[0].Port = "metrics" }, `port "metrics"`},
		{"PodMonitor selects no pod", func(r *rendered) {
			r.monitors[0].Spec.Selector.MatchLabels = map[string]string{"app": "relay"}
		}, "matches no pod template"},
	})
}

func isNATSFlag(a string) bool { return strings.HasPrefix(a, "--nats=") }

// The relay component's JSON patch replaces the engine's sixth argument;
// its "test" operations must make kustomize refuse a Deployment laid out
// otherwise instead of replacing the wrong argument.
func TestRelayComponentRefusesOtherEngines(t *testing.T) {
	engine, err := os.ReadFile("vllm/deployment.yaml")
	if err != nil {
		t.Fatal(err)
	}
	component, err := filepath.Abs("components/relay-sidecar")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ name, old, new string }{
		{"unchanged", "", ""},
		{"other ranks", "--data-parallel-size=2", "--data-parallel-size=4"},
		{"another argument order", "- --enable-prefix-caching\n", ""},
		{"another container name", "- name: vllm\n", "- name: engine\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			y := string(engine)
			if c.old != "" {
				if !strings.Contains(y, c.old) {
					t.Fatalf("vllm/deployment.yaml has no %q", c.old)
				}
				y = strings.Replace(y, c.old, c.new, 1)
			}
			rel, err := filepath.Rel(dir, component)
			if err != nil {
				t.Fatal(err)
			}
			k := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [deployment.yaml]\ncomponents: [" + strconv.Quote(rel) + "]\n"
			for name, data := range map[string]string{"deployment.yaml": y, "kustomization.yaml": k} {
				if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			_, err = krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
			if (err == nil) != (c.old == "") {
				t.Errorf("kustomize build: error %v; want one only for a changed engine", err)
			}
		})
	}
}
