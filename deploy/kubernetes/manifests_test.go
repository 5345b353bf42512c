package kubernetes

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io/fs"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	psa "k8s.io/pod-security-admission/api"
	"k8s.io/pod-security-admission/policy"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// The labels that admit engines and clients: the contract with the
// engines' and the gateways' pod templates (deploy/README.md), so a change
// here is one users must follow.
var (
	engineLabels = map[string]string{"kvindex.io/engine": "true"}
	clientLabels = map[string]string{"kvindex.io/client": "true"}
)

// The peers the policies name, as peerString writes them.
var (
	enginePeer     = "pods " + labels.SelectorFromSet(engineLabels).String() + " in this namespace"
	clientPeer     = "pods " + labels.SelectorFromSet(clientLabels).String() + " in this namespace"
	dnsPeer        = "pods k8s-app=kube-dns in namespaces kubernetes.io/metadata.name=kube-system"
	natsPeer       = "pods app.kubernetes.io/name=nats in this namespace"
	prometheusPeer = "pods app.kubernetes.io/name=prometheus in namespaces kubernetes.io/metadata.name=monitoring"
)

// build is one thing a user can apply: a kustomization directory, or a
// base plus components (built through a temporary overlay, as a user's
// own overlay would include them).
type build struct {
	name       string
	dir        string
	components []string
	// kvindex: the build deploys kvindex, so its ports, user and network
	// policy are checked against its ConfigMap and the Dockerfile.
	kvindex bool
	// extraIngress: flows admitted beyond the base's engines and clients.
	extraIngress []flow
	// replicas: kvindex runs as interchangeable replicas (NATS mode), so
	// its rollout, probes, disruption budget and spread are checked.
	replicas bool
	// relay: the build's engines publish through the relay sidecar, whose
	// flags are checked against the engine's.
	relay bool
	// extraEgress: flows kvindex may open beyond the base's.
	extraEgress []flow
	// apiReader: kvindex reads pods from the API server (discovery), so
	// its pods mount a token bound to exactly that.
	apiReader bool
}

var builds = []build{
	{name: "base", dir: "base", kvindex: true},
	{name: "base+prometheus", dir: "base", components: []string{"components/prometheus"}, kvindex: true,
		extraIngress: []flow{{prometheusPeer, "TCP/8080"}}},
	{name: "base+discovery", dir: "base", components: []string{"components/discovery"}, kvindex: true, apiReader: true,
		extraEgress: []flow{{"anyone", "TCP/443"}, {"anyone", "TCP/6443"}, {enginePeer, "TCP/5557"}, {enginePeer, "TCP/5558"}}},
	{name: "vllm", dir: "vllm"},
	{name: "replicas", dir: "replicas", kvindex: true, replicas: true},
	{name: "replicas+prometheus+monitoring", dir: "replicas",
		components: []string{"components/prometheus", "components/monitoring"}, kvindex: true, replicas: true,
		extraIngress: []flow{{prometheusPeer, "TCP/8080"}}},
	{name: "vllm+relay-sidecar", dir: "vllm", components: []string{"components/relay-sidecar"}, relay: true},
	{name: "vllm-relay", dir: "vllm-relay", relay: true},
	{name: "vllm-relay+relay-monitoring", dir: "vllm-relay", components: []string{"components/relay-monitoring"}, relay: true},
}

func TestManifests(t *testing.T) {
	for _, b := range builds {
		t.Run(b.name, func(t *testing.T) {
			r := render(t, b)
			for _, p := range problems(r, b) {
				t.Error(p)
			}
		})
	}
}

// Every kustomization in this directory is built by some entry of builds,
// so a new one cannot go unchecked.
func TestEveryKustomizationBuilt(t *testing.T) {
	covered := map[string]bool{}
	for _, b := range builds {
		covered[b.dir] = true
		for _, c := range b.components {
			covered[c] = true
		}
	}
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.Name() != "kustomization.yaml" {
			return err
		}
		if dir := filepath.Dir(path); !covered[dir] {
			t.Errorf("%s is built by no entry of builds", dir)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// The engines of the vLLM example are the pods the base admits to the
// event ports.
func TestExampleEnginesAdmitted(t *testing.T) {
	r := render(t, build{dir: "vllm"})
	if len(r.deployments) == 0 {
		t.Fatal("the vLLM example renders no Deployment")
	}
	sel := labels.SelectorFromSet(engineLabels)
	for _, d := range r.deployments {
		if !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
			t.Errorf("Deployment %s: pod labels %v do not match the engines' selector %s", d.Name, d.Spec.Template.Labels, sel)
		}
	}
}

// Each change here breaks one rule in the rendered base; the checks must
// report it. This keeps TestManifests honest: a check that cannot fail
// shows up here, not in a cluster.
func TestManifestChecksFail(t *testing.T) {
	base := builds[0]
	good := render(t, base)
	if p := problems(good, base); len(p) > 0 {
		t.Fatalf("the base itself has problems: %v", p)
	}
	pod := func(r *rendered) *corev1.PodSpec { return &r.deployments[0].Spec.Template.Spec }
	ctr := func(r *rendered) *corev1.Container { return &pod(r).Containers[0] }
	np := func(r *rendered) *networkingv1.NetworkPolicySpec { return &r.policies[0].Spec }
	cases := []struct {
		name   string
		mutate func(*rendered)
		want   string
	}{
		{"no seccomp profile", func(r *rendered) { pod(r).SecurityContext.SeccompProfile = nil }, "seccompProfile"},
		{"seccomp unconfined", func(r *rendered) {
			pod(r).SecurityContext.SeccompProfile.Type = corev1.SeccompProfileTypeUnconfined
		}, "seccompProfile"},
		{"capabilities kept", func(r *rendered) { ctr(r).SecurityContext.Capabilities = nil }, "capabilities"},
		{"capability added", func(r *rendered) {
			ctr(r).SecurityContext.Capabilities.Add = []corev1.Capability{"NET_ADMIN"}
		}, "capabilities"},
		{"privilege escalation", func(r *rendered) {
			ctr(r).SecurityContext.AllowPrivilegeEscalation = nil
		}, "allowPrivilegeEscalation"},
		{"may run as root", func(r *rendered) { pod(r).SecurityContext.RunAsNonRoot = nil }, "runAsNonRoot"},
		{"root user", func(r *rendered) { pod(r).SecurityContext.RunAsUser = ptr[int64](0) }, "runAsUser=0"},
		{"host network", func(r *rendered) { pod(r).HostNetwork = true }, "host namespaces"},
		{"hostPath volume", func(r *rendered) {
			pod(r).Volumes[1].VolumeSource = corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/var/lib/kvindex"}}
		}, "hostPath"},
		{"writable root", func(r *rendered) { ctr(r).SecurityContext.ReadOnlyRootFilesystem = nil }, "readOnlyRootFilesystem"},
		{"token mounted", func(r *rendered) { pod(r).AutomountServiceAccountToken = nil }, "automountServiceAccountToken"},
		{"latest image", func(r *rendered) { ctr(r).Image = "kvindex:latest" }, ":latest"},
		{"untagged image", func(r *rendered) { ctr(r).Image = "registry:5000/kvindex" }, "no tag"},
		{"not the Dockerfile's user", func(r *rendered) { *pod(r).SecurityContext.RunAsUser = 1000 }, "Dockerfile"},
		{"container port not in the config", func(r *rendered) { ctr(r).Ports[1].ContainerPort = 8081 }, "container ports"},
		{"rank's event port missing", func(r *rendered) { ctr(r).Ports = ctr(r).Ports[:3] }, "container ports"},
		{"ingress from anyone", func(r *rendered) {
			np(r).Ingress = append(np(r).Ingress, networkingv1.NetworkPolicyIngressRule{})
		}, "anyone"},
		{"query port open to engines", func(r *rendered) {
			np(r).Ingress[0].Ports = append(np(r).Ingress[0].Ports, networkingv1.NetworkPolicyPort{Port: ptr(intstr.FromString("grpc"))})
		}, enginePeer},
		{"egress unrestricted", func(r *rendered) { np(r).PolicyTypes = np(r).PolicyTypes[:1] }, "egress"},
		{"egress anywhere", func(r *rendered) {
			np(r).Egress = append(np(r).Egress, networkingv1.NetworkPolicyEgressRule{})
		}, "anyone"},
		{"policy selects no kvindex pod", func(r *rendered) {
			np(r).PodSelector.MatchLabels = map[string]string{"app": "kvindex"}
		}, "ingress"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := good.deepCopy()
			c.mutate(&r)
			got := problems(r, base)
			if !slices.ContainsFunc(got, func(p string) bool { return strings.Contains(p, c.want) }) {
				t.Errorf("problems %q, want one mentioning %q", got, c.want)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

// rendered is a build's output, decoded into the upstream API types.
type rendered struct {
	deployments     []*appsv1.Deployment
	services        []*corev1.Service
	configMaps      []*corev1.ConfigMap
	serviceAccounts []*corev1.ServiceAccount
	policies        []*networkingv1.NetworkPolicy
	budgets         []*policyv1.PodDisruptionBudget
	monitors        []*monitor
	roles           []*rbacv1.Role
	roleBindings    []*rbacv1.RoleBinding
}

func (r rendered) deepCopy() rendered {
	return rendered{
		deployments:     deepCopyAll(r.deployments, (*appsv1.Deployment).DeepCopy),
		services:        deepCopyAll(r.services, (*corev1.Service).DeepCopy),
		configMaps:      deepCopyAll(r.configMaps, (*corev1.ConfigMap).DeepCopy),
		serviceAccounts: deepCopyAll(r.serviceAccounts, (*corev1.ServiceAccount).DeepCopy),
		policies:        deepCopyAll(r.policies, (*networkingv1.NetworkPolicy).DeepCopy),
		budgets:         deepCopyAll(r.budgets, (*policyv1.PodDisruptionBudget).DeepCopy),
		monitors:        deepCopyAll(r.monitors, (*monitor).deepCopy),
		roles:           deepCopyAll(r.roles, (*rbacv1.Role).DeepCopy),
		roleBindings:    deepCopyAll(r.roleBindings, (*rbacv1.RoleBinding).DeepCopy),
	}
}

func deepCopyAll[T any](in []*T, cp func(*T) *T) []*T {
	out := make([]*T, len(in))
	for i, v := range in {
		out[i] = cp(v)
	}
	return out
}

// render builds b with kustomize and decodes every object strictly: a
// field the API type does not have (a typo, or a field in the wrong
// place) fails the build instead of being dropped the way kubectl's
// client-side apply of an unknown field would be.
func render(t *testing.T, b build) rendered {
	t.Helper()
	dir, err := filepath.Abs(b.dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(b.components) > 0 {
		// kustomize takes no absolute paths: the overlay names the base and
		// the components relative to itself.
		overlay := t.TempDir()
		rel := func(path string) string {
			t.Helper()
			abs, err := filepath.Abs(path)
			if err == nil {
				path, err = filepath.Rel(overlay, abs)
			}
			if err != nil {
				t.Fatal(err)
			}
			return strconv.Quote(path)
		}
		k := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [" + rel(dir) + "]\ncomponents:\n"
		for _, c := range b.components {
			k += "  - " + rel(c) + "\n"
		}
		if err := os.WriteFile(filepath.Join(overlay, "kustomization.yaml"), []byte(k), 0o644); err != nil {
			t.Fatal(err)
		}
		dir = overlay
	}
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", b.dir, err)
	}
	var r rendered
	for _, res := range m.Resources() {
		y, err := res.AsYAML()
		if err != nil {
			t.Fatal(err)
		}
		name := res.GetApiVersion() + " " + res.GetKind() + " " + res.GetName()
		var obj any
		switch res.GetApiVersion() + "/" + res.GetKind() {
		case "apps/v1/Deployment":
			d := &appsv1.Deployment{}
			r.deployments, obj = append(r.deployments, d), d
		case "v1/Service":
			s := &corev1.Service{}
			r.services, obj = append(r.services, s), s
		case "v1/ConfigMap":
			c := &corev1.ConfigMap{}
			r.configMaps, obj = append(r.configMaps, c), c
		case "v1/ServiceAccount":
			s := &corev1.ServiceAccount{}
			r.serviceAccounts, obj = append(r.serviceAccounts, s), s
		case "networking.k8s.io/v1/NetworkPolicy":
			p := &networkingv1.NetworkPolicy{}
			r.policies, obj = append(r.policies, p), p
		case "policy/v1/PodDisruptionBudget":
			p := &policyv1.PodDisruptionBudget{}
			r.budgets, obj = append(r.budgets, p), p
		case "monitoring.coreos.com/v1/ServiceMonitor", "monitoring.coreos.com/v1/PodMonitor":
			m := &monitor{}
			r.monitors, obj = append(r.monitors, m), m
		case "rbac.authorization.k8s.io/v1/Role":
			ro := &rbacv1.Role{}
			r.roles, obj = append(r.roles, ro), ro
		case "rbac.authorization.k8s.io/v1/RoleBinding":
			rb := &rbacv1.RoleBinding{}
			r.roleBindings, obj = append(r.roleBindings, rb), rb
		default:
			t.Fatalf("%s: no API type to check it against; add one to render", name)
		}
		if err := yaml.UnmarshalStrict(y, obj); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	return r
}

// problems lists every rule r breaks; none means r passes.
func problems(r rendered, b build) []string {
	var out []string
	for _, d := range r.deployments {
		for _, p := range podProblems(&d.Spec.Template, b.apiReader) {
			out = append(out, "Deployment "+d.Name+": "+p)
		}
	}
	out = append(out, wiringProblems(r)...)
	if b.apiReader {
		out = append(out, rbacProblems(r)...)
	} else if len(r.roles)+len(r.roleBindings) > 0 {
		out = append(out, "a Role or RoleBinding in a build whose pods call no API")
	}
	if b.kvindex {
		out = append(out, kvindexProblems(r, b)...)
	}
	if b.replicas {
		out = append(out, replicaProblems(r)...)
	}
	out = append(out, relayProblems(r, b)...)
	return out
}

// restricted evaluates pods with the checks the Pod Security admission
// controller runs, at the newest policy version it knows.
var restricted, restrictedErr = policy.NewEvaluator(policy.DefaultChecks(), nil)

func podProblems(tmpl *corev1.PodTemplateSpec, apiReader bool) []string {
	if restrictedErr != nil {
		return []string{"Pod Security checks: " + restrictedErr.Error()}
	}
	var out []string
	lv := psa.LevelVersion{Level: psa.LevelRestricted, Version: psa.LatestVersion()}
	for _, res := range restricted.EvaluatePod(lv, &tmpl.ObjectMeta, &tmpl.Spec) {
		if !res.Allowed {
			out = append(out, fmt.Sprintf("Pod Security restricted: %s (%s)", res.ForbiddenReason, res.ForbiddenDetail))
		}
	}
	// The pod's field wins over the service account's; stating it keeps
	// the pod token-free whatever account it runs as (or, for an API
	// reader, gives it the token whatever the account says).
	if a := tmpl.Spec.AutomountServiceAccountToken; !apiReader && (a == nil || *a) {
		out = append(out, "automountServiceAccountToken is not false")
	} else if apiReader && (a == nil || !*a) {
		out = append(out, "automountServiceAccountToken is not true (the pod reads the API)")
	}
	for _, c := range slices.Concat(tmpl.Spec.InitContainers, tmpl.Spec.Containers) {
		if sc := c.SecurityContext; sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
			out = append(out, "container "+c.Name+": readOnlyRootFilesystem is not true")
		}
		if p := imageProblem(c.Image); p != "" {
			out = append(out, "container "+c.Name+": image "+c.Image+": "+p)
		}
	}
	return out
}

// imageProblem says why image is not pinned to a version, or "".
func imageProblem(image string) string {
	if _, digest, ok := strings.Cut(image, "@"); ok {
		if strings.HasPrefix(digest, "sha256:") {
			return ""
		}
		return "digest is not sha256"
	}
	// The tag follows the last ':' of the last path element; an earlier
	// ':' is a registry's port.
	_, tag, ok := strings.Cut(image[strings.LastIndexByte(image, '/')+1:], ":")
	switch {
	case !ok || tag == "":
		return "no tag (pulls :latest)"
	case tag == "latest":
		return ":latest is not a version"
	}
	return ""
}

// serveConfig is what the ports depend on in the ConfigMap's
// config.yaml, whose keys are `kvindex serve` flag names.
type serveConfig struct {
	GRPCAddr       string `json:"grpc-addr"`
	HTTPAddr       string `json:"http-addr"`
	Listen         string `json:"listen"`
	ListenRanks    int    `json:"listen-ranks"`
	ReplayTemplate string `json:"replay-template"`
	TokenizeURL    string `json:"tokenize-url"`
	NATS           string `json:"nats"`
	MemoryBudget   string `json:"memory-budget"`
}

// serveSettings are the settings kvindex's container runs with: the
// ConfigMap's config.yaml, overridden by the command line's flags (as
// serve reads them: the command line wins over the --config file).
func serveSettings(configYAML string, args []string) (serveConfig, error) {
	var cfg serveConfig
	settings := map[string]any{}
	// Not strict: the config has many settings the ports do not depend on
	// (cmd/kvindex's tests check them against the flags).
	if err := yaml.Unmarshal([]byte(configYAML), &settings); err != nil {
		return cfg, fmt.Errorf("config.yaml: %w", err)
	}
	flags, _ := parseFlags(args)
	for k, v := range flags {
		var val any
		if err := yaml.Unmarshal([]byte(v), &val); err != nil {
			val = v
		}
		settings[k] = val
	}
	j, err := json.Marshal(settings)
	if err == nil {
		err = json.Unmarshal(j, &cfg)
	}
	return cfg, err
}

// parseFlags splits a command line into its flags ("--name=value" or
// "--name value") and its other arguments.
func parseFlags(args []string) (map[string]string, []string) {
	flags := map[string]string{}
	var rest []string
	for i := 0; i < len(args); i++ {
		name, ok := strings.CutPrefix(args[i], "--")
		if !ok {
			rest = append(rest, args[i])
			continue
		}
		if n, v, ok := strings.Cut(name, "="); ok {
			flags[n] = v
		} else if i+1 < len(args) && !strings.HasPrefix(args[i+1], "--") {
			flags[name] = args[i+1]
			i++
		} else {
			flags[name] = "true"
		}
	}
	return flags, rest
}

// kvindexProblems checks kvindex's Deployment against its ConfigMap, the
// Dockerfile and the NetworkPolicies.
func kvindexProblems(r rendered, b build) []string {
	var out []string
	d, okD := find(r.deployments, "kvindex", func(d *appsv1.Deployment) string { return d.Name })
	cm, okC := find(r.configMaps, "kvindex", func(c *corev1.ConfigMap) string { return c.Name })
	if !okD || !okC {
		return []string{"no Deployment and ConfigMap named kvindex"}
	}
	pod := &d.Spec.Template
	c, ok := find(pod.Spec.Containers, "kvindex", func(c corev1.Container) string { return c.Name })
	if !ok {
		return []string{"Deployment kvindex: no container named kvindex"}
	}
	cfg, err := serveSettings(cm.Data["config.yaml"], c.Args)
	if err != nil {
		return []string{"ConfigMap kvindex and the container's arguments: " + err.Error()}
	}
	// The addresses are checked as written: a default is the flag's to
	// keep, and the manifests state every address they expose. In NATS
	// mode (--nats) the events come from the stream: no event port.
	if cfg.GRPCAddr == "" || cfg.HTTPAddr == "" || (cfg.NATS == "" && (cfg.Listen == "" || cfg.ListenRanks < 1)) {
		return []string{"ConfigMap kvindex: give grpc-addr, http-addr, and either --nats or listen and listen-ranks"}
	}
	if cfg.NATS != "" && (cfg.Listen != "" || cfg.ReplayTemplate != "") {
		return []string{"kvindex: NATS mode (--nats) with listen or replay-template: the relays publish the engines' events, kvindex takes none from them"}
	}
	want := map[string]string{"grpc": portOf(cfg.GRPCAddr), "http": portOf(cfg.HTTPAddr)}
	var eventPorts []string
	if cfg.NATS == "" {
		events, err := strconv.Atoi(portOf(cfg.Listen))
		if err != nil {
			return []string{"ConfigMap kvindex: listen " + cfg.Listen + ": no port"}
		}
		for r := range cfg.ListenRanks {
			want["kv-events-"+strconv.Itoa(r)] = strconv.Itoa(events + r)
			eventPorts = append(eventPorts, "TCP/"+strconv.Itoa(events+r))
		}
	}
	if p := memoryProblem(cfg.MemoryBudget, c); p != "" {
		out = append(out, "Deployment kvindex: "+p)
	}

	got := map[string]string{}
	named := map[string]int32{}
	for _, p := range c.Ports {
		got[p.Name] = strconv.Itoa(int(p.ContainerPort))
		named[p.Name] = p.ContainerPort
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		out = append(out, fmt.Sprintf("Deployment kvindex: container ports %v, the ConfigMap listens on %v", got, want))
	}

	uid, err := dockerfileUser("../Dockerfile")
	if err != nil {
		out = append(out, err.Error())
	} else if u := runAsUser(pod.Spec, c); u == nil || *u != uid {
		out = append(out, fmt.Sprintf("Deployment kvindex: runAsUser %v, the Dockerfile's USER is %d", deref(u), uid))
	}

	// Policy flows: who may reach kvindex on which port, whom kvindex may
	// reach. Exactly these, so that any other source or port is refused.
	wantIn := []flow{{clientPeer, "TCP/" + want["grpc"]}, {clientPeer, "TCP/" + want["http"]}}
	for _, p := range eventPorts {
		wantIn = append(wantIn, flow{enginePeer, p})
	}
	wantIn = append(wantIn, b.extraIngress...)
	wantOut := slices.Clone(b.extraEgress)
	dns := false
	if cfg.NATS != "" {
		u, err := url.Parse(cfg.NATS)
		if err != nil || u.Scheme != "nats" {
			return append(out, "kvindex: --nats "+cfg.NATS+": not a nats:// URL")
		}
		port := u.Port()
		if port == "" {
			port = "4222" // NATS's client port
		}
		wantOut = append(wantOut, flow{natsPeer, "TCP/" + port})
		dns = net.ParseIP(u.Hostname()) == nil
	}
	if cfg.ReplayTemplate != "" {
		replay, err := strconv.Atoi(portOf(cfg.ReplayTemplate))
		if err != nil {
			return append(out, "ConfigMap kvindex: replay-template "+cfg.ReplayTemplate+": no port")
		}
		for r := range cfg.ListenRanks {
			wantOut = append(wantOut, flow{enginePeer, "TCP/" + strconv.Itoa(replay+r)})
		}
	}
	if cfg.TokenizeURL != "" {
		u, err := url.Parse(cfg.TokenizeURL)
		if err != nil {
			return append(out, "ConfigMap kvindex: tokenize-url: "+err.Error())
		}
		port := u.Port()
		if port == "" {
			port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
		}
		// The Service's port is taken to be the engines' container port,
		// as in ../vllm: the policy sees the pod's port, after the
		// Service's translation.
		wantOut = append(wantOut, flow{enginePeer, "TCP/" + port})
		dns = dns || net.ParseIP(u.Hostname()) == nil
	}
	if dns {
		wantOut = append(wantOut, flow{dnsPeer, "UDP/53"}, flow{dnsPeer, "TCP/53"})
	}
	in, outFlows, types := policyFlows(r.policies, pod.Labels, named)
	for _, dir := range []struct {
		name      string
		got, want []flow
	}{{"ingress", in, wantIn}, {"egress", outFlows, wantOut}} {
		if !types[dir.name] {
			out = append(out, "no NetworkPolicy restricts kvindex's "+dir.name)
			continue
		}
		for _, f := range dir.got {
			if !slices.Contains(dir.want, f) {
				out = append(out, fmt.Sprintf("NetworkPolicy %s: %s allowed on %s", dir.name, f.peer, f.port))
			}
		}
		for _, f := range dir.want {
			if !slices.Contains(dir.got, f) {
				out = append(out, fmt.Sprintf("NetworkPolicy %s: %s refused on %s", dir.name, f.peer, f.port))
			}
		}
	}
	return out
}

// rbacProblems checks what discovery may do: read (get, list, watch)
// pods, nothing else, bound to the service account kvindex runs as.
func rbacProblems(r rendered) []string {
	d, ok := find(r.deployments, "kvindex", func(d *appsv1.Deployment) string { return d.Name })
	if !ok {
		return []string{"no Deployment named kvindex"}
	}
	sa := d.Spec.Template.Spec.ServiceAccountName
	var out []string
	bound := false
	for _, rb := range r.roleBindings {
		ro, ok := find(r.roles, rb.RoleRef.Name, func(ro *rbacv1.Role) string { return ro.Name })
		if rb.RoleRef.Kind != "Role" || !ok {
			out = append(out, "RoleBinding "+rb.Name+": binds no Role of this build")
			continue
		}
		for _, s := range rb.Subjects {
			bound = bound || (s.Kind == rbacv1.ServiceAccountKind && s.Name == sa && s.Namespace == "")
		}
		for _, rule := range ro.Rules {
			if !slices.Equal(rule.APIGroups, []string{""}) || !slices.Equal(rule.Resources, []string{"pods"}) ||
				len(rule.ResourceNames) > 0 || len(rule.NonResourceURLs) > 0 {
				out = append(out, fmt.Sprintf("Role %s: rule %v reaches beyond pods", ro.Name, rule))
			}
			for _, v := range rule.Verbs {
				if !slices.Contains([]string{"get", "list", "watch"}, v) {
					out = append(out, fmt.Sprintf("Role %s: verb %q on %v (want get, list and watch only)", ro.Name, v, rule.Resources))
				}
			}
		}
	}
	if !bound {
		out = append(out, "no RoleBinding binds the service account "+sa+" kvindex runs as")
	}
	return out
}

// flow is one peer allowed on one port ("TCP/5557").
type flow struct{ peer, port string }

// policyFlows lists the flows that the policies selecting pods with
// labels podLabels allow, named ports resolved through named, and which
// directions (ingress, egress) those policies restrict at all.
func policyFlows(policies []*networkingv1.NetworkPolicy, podLabels map[string]string, named map[string]int32) (in, out []flow, types map[string]bool) {
	types = map[string]bool{}
	for _, p := range policies {
		sel, err := metav1.LabelSelectorAsSelector(&p.Spec.PodSelector)
		if err != nil || !sel.Matches(labels.Set(podLabels)) {
			continue
		}
		for _, t := range p.Spec.PolicyTypes {
			types[strings.ToLower(string(t))] = true
		}
		for _, rule := range p.Spec.Ingress {
			in = append(in, ruleFlows(rule.From, rule.Ports, named)...)
		}
		for _, rule := range p.Spec.Egress {
			// An egress port name is the destination's; only numbers are
			// compared there.
			out = append(out, ruleFlows(rule.To, rule.Ports, nil)...)
		}
	}
	return in, out, types
}

func ruleFlows(peers []networkingv1.NetworkPolicyPeer, ports []networkingv1.NetworkPolicyPort, named map[string]int32) []flow {
	peerNames := []string{"anyone"} // no peers: every source or destination
	if len(peers) > 0 {
		peerNames = nil
		for _, p := range peers {
			peerNames = append(peerNames, peerString(p))
		}
	}
	portNames := []string{"any port"}
	if len(ports) > 0 {
		portNames = nil
		for _, p := range ports {
			portNames = append(portNames, portString(p, named))
		}
	}
	var out []flow
	for _, peer := range peerNames {
		for _, port := range portNames {
			out = append(out, flow{peer, port})
		}
	}
	return out
}

func peerString(p networkingv1.NetworkPolicyPeer) string {
	if p.IPBlock != nil {
		return "ipBlock " + p.IPBlock.CIDR + " except " + strings.Join(p.IPBlock.Except, ",")
	}
	pods, ns := "all pods", "this namespace"
	if p.PodSelector != nil {
		pods = "pods " + metav1.FormatLabelSelector(p.PodSelector)
	}
	if p.NamespaceSelector != nil {
		ns = "namespaces " + metav1.FormatLabelSelector(p.NamespaceSelector)
	}
	return pods + " in " + ns
}

func portString(p networkingv1.NetworkPolicyPort, named map[string]int32) string {
	proto := "TCP" // the API's default
	if p.Protocol != nil {
		proto = string(*p.Protocol)
	}
	if p.Port == nil {
		return proto + "/any"
	}
	port := p.Port.String()
	if p.Port.Type == intstr.String {
		if n, ok := named[port]; ok {
			port = strconv.Itoa(int(n))
		}
	}
	if p.EndPort != nil {
		port += "-" + strconv.Itoa(int(*p.EndPort))
	}
	return proto + "/" + port
}

// portOf is the port of an address or endpoint: "tcp://*:5557", ":8080",
// "tcp://{pod}:5567".
func portOf(addr string) string { return addr[strings.LastIndexByte(addr, ':')+1:] }

// runAsUser is the user c runs as: its own setting, else the pod's.
func runAsUser(pod corev1.PodSpec, c corev1.Container) *int64 {
	if c.SecurityContext != nil && c.SecurityContext.RunAsUser != nil {
		return c.SecurityContext.RunAsUser
	}
	if pod.SecurityContext != nil {
		return pod.SecurityContext.RunAsUser
	}
	return nil
}

// dockerfileUser is the numeric user of the Dockerfile's last USER line:
// the kubelet can only enforce runAsNonRoot for a numeric one.
func dockerfileUser(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	user := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fields := strings.Fields(sc.Text()); len(fields) == 2 && fields[0] == "USER" {
			user = fields[1]
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	uid, _, _ := strings.Cut(user, ":")
	n, err := strconv.ParseInt(uid, 10, 64)
	if err != nil || n == 0 {
		return 0, fmt.Errorf("%s: USER %q is not a numeric non-root user", path, user)
	}
	return n, nil
}

func find[T any](items []T, name string, nameOf func(T) string) (T, bool) {
	for _, it := range items {
		if nameOf(it) == name {
			return it, true
		}
	}
	var zero T
	return zero, false
}

func deref(p *int64) any {
	if p == nil {
		return "unset"
	}
	return *p
}

// Each change breaks one rule of the discovery component; the checks must
// report it.
func TestDiscoveryChecksFail(t *testing.T) {
	var b build
	for _, x := range builds {
		if x.apiReader {
			b = x
		}
	}
	good := render(t, b)
	if p := problems(good, b); len(p) > 0 {
		t.Fatalf("the discovery build itself has problems: %v", p)
	}
	cases := []struct {
		name   string
		mutate func(*rendered)
		want   string
	}{
		{"no token", func(r *rendered) { r.deployments[0].Spec.Template.Spec.AutomountServiceAccountToken = nil }, "automountServiceAccountToken"},
		{"may write pods", func(r *rendered) { r.roles[0].Rules[0].Verbs = append(r.roles[0].Rules[0].Verbs, "delete") }, `verb "delete"`},
		{"reads secrets", func(r *rendered) { r.roles[0].Rules[0].Resources = []string{"pods", "secrets"} }, "beyond pods"},
		{"bound to another account", func(r *rendered) { r.roleBindings[0].Subjects[0].Name = "default" }, "no RoleBinding binds"},
		{"API server port closed", func(r *rendered) {
			for _, p := range r.policies {
				if p.Name == "kvindex-discovery" {
					p.Spec.Egress = p.Spec.Egress[1:]
				}
			}
		}, "refused on TCP/443"},
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
