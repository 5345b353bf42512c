package nats

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/internal/bytesize"
	"github.com/kvindex/kvindex/internal/service"
	"github.com/kvindex/kvindex/internal/snapstore"
	"github.com/kvindex/kvindex/kvevents/natstransport"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/yaml"
)

// values is the part of the chart's values.yaml (nats-io/k8s,
// helm/charts/nats, 1.x) that values.yaml sets. Decoding is strict, so a
// key this struct lacks fails the test: add it here when values.yaml
// starts using it, after checking the chart has it.
type values struct {
	FullnameOverride string `json:"fullnameOverride"`
	Config           struct {
		Cluster struct {
			Enabled  bool `json:"enabled"`
			Replicas int  `json:"replicas"`
		} `json:"cluster"`
		JetStream struct {
			Enabled   bool `json:"enabled"`
			FileStore struct {
				Enabled bool   `json:"enabled"`
				Dir     string `json:"dir"`
				MaxSize string `json:"maxSize"`
				PVC     struct {
					Enabled          bool   `json:"enabled"`
					Size             string `json:"size"`
					StorageClassName string `json:"storageClassName,omitempty"`
				} `json:"pvc"`
			} `json:"fileStore"`
			MemoryStore struct {
				Enabled bool   `json:"enabled"`
				MaxSize string `json:"maxSize,omitempty"`
			} `json:"memoryStore"`
		} `json:"jetstream"`
		Monitor struct {
			Enabled bool `json:"enabled"`
			Port    int  `json:"port"`
		} `json:"monitor"`
		Merge struct {
			Authorization *struct {
				Users []User `json:"users"`
			} `json:"authorization"`
		} `json:"merge"`
	} `json:"config"`
	Container struct {
		Image struct {
			Repository string `json:"repository"`
			Tag        string `json:"tag"`
		} `json:"image"`
		Env   map[string]envValue `json:"env"`
		Merge containerMerge      `json:"merge"`
	} `json:"container"`
	Reloader struct {
		Enabled bool           `json:"enabled"`
		Merge   containerMerge `json:"merge"`
	} `json:"reloader"`
	PromExporter struct {
		Enabled    bool           `json:"enabled"`
		Port       int            `json:"port"`
		Merge      containerMerge `json:"merge"`
		PodMonitor struct {
			Enabled bool `json:"enabled"`
		} `json:"podMonitor"`
	} `json:"promExporter"`
	PodTemplate struct {
		// Keyed by topology key; the chart fills in the label selector.
		TopologySpreadConstraints map[string]struct {
			MaxSkew           int    `json:"maxSkew"`
			WhenUnsatisfiable string `json:"whenUnsatisfiable"`
		} `json:"topologySpreadConstraints"`
		Merge struct {
			Spec struct {
				SecurityContext *corev1.PodSecurityContext `json:"securityContext"`
			} `json:"spec"`
		} `json:"merge"`
	} `json:"podTemplate"`
	PodDisruptionBudget struct {
		Enabled bool `json:"enabled"`
	} `json:"podDisruptionBudget"`
	NatsBox struct {
		Enabled bool `json:"enabled"`
	} `json:"natsBox"`
}

// envValue is one of the chart's container.env entries: a value, or
// (a map) the rest of a Kubernetes EnvVar, such as valueFrom.
type envValue struct {
	Value     string
	ValueFrom *corev1.EnvVarSource
}

func (e *envValue) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] == '"' {
		return json.Unmarshal(b, &e.Value)
	}
	var m struct {
		ValueFrom *corev1.EnvVarSource `json:"valueFrom"`
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return err
	}
	e.ValueFrom = m.ValueFrom
	return nil
}

// containerMerge is the chart's per-container "merge" block: fields
// merged into the generated container.
type containerMerge struct {
	Resources       *corev1.ResourceRequirements `json:"resources,omitempty"`
	SecurityContext *corev1.SecurityContext      `json:"securityContext,omitempty"`
}

// streamSettings are the kvindex replicas' settings that the NATS servers
// must make room for (../kubernetes/replicas/configmap.yaml), the NATS
// URLs and users the manifests give kvindex and the relays, and the
// NetworkPolicy in front of the servers.
type streamSettings struct {
	MaxBytes     int64
	Replicas     int
	SnapshotKeep int
	MemoryBudget int64 // a snapshot is smaller than the index it is of
	URLs         []string
	// Stream and Bucket are the names the replicas use (--nats-stream,
	// --snapshot-bucket).
	Stream, Bucket string
	// Roles are the kvindex containers that connect, by role.
	Roles map[string]client
	// Policy is networkpolicy.yaml; nil when missing.
	Policy *networkingv1.NetworkPolicy
}

// client is a kvindex container that connects to NATS: its pod's labels,
// and the user and password its environment gives it
// (service.EnvNATSUser, service.EnvNATSPassword).
type client struct {
	Labels   map[string]string
	User     string
	Password *corev1.SecretKeySelector
}

// The roles, as kvindex names them.
const (
	roleRelay   = service.RoleRelay
	roleReplica = service.RoleReplica
)

func loadValues(t *testing.T, data []byte) values {
	t.Helper()
	var v values
	if err := yaml.UnmarshalStrict(data, &v); err != nil {
		t.Fatalf("values.yaml: %v", err)
	}
	return v
}

func loadStream(t *testing.T) streamSettings {
	t.Helper()
	var cm struct {
		Data map[string]string `json:"data"`
	}
	data, err := os.ReadFile("../kubernetes/replicas/configmap.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, &cm); err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		MaxBytes       string `json:"nats-max-bytes"`
		Replicas       int    `json:"nats-replicas"`
		SnapshotKeep   int    `json:"snapshot-keep"`
		MemoryBudget   string `json:"memory-budget"`
		Stream         string `json:"nats-stream"`
		SnapshotBucket string `json:"snapshot-bucket"`
	}
	if err := yaml.Unmarshal([]byte(cm.Data["config.yaml"]), &cfg); err != nil {
		t.Fatal(err)
	}
	var s streamSettings
	if s.MaxBytes, err = bytesize.Parse(cfg.MaxBytes); err != nil {
		t.Fatalf("nats-max-bytes: %v", err)
	}
	if s.MemoryBudget, err = bytesize.Parse(cfg.MemoryBudget); err != nil {
		t.Fatalf("memory-budget: %v", err)
	}
	s.Replicas, s.SnapshotKeep = cfg.Replicas, cfg.SnapshotKeep
	s.Stream = cmp.Or(cfg.Stream, natstransport.DefaultStream)
	s.Bucket = cmp.Or(cfg.SnapshotBucket, snapstore.DefaultBucket)
	s.Roles = map[string]client{
		roleReplica: loadClient(t, "../kubernetes/replicas/deployment.yaml", "kvindex", "../kubernetes/replicas/deployment.yaml"),
		// The relay runs in the engines' pods (the vLLM example's).
		roleRelay: loadClient(t, "../kubernetes/components/relay-sidecar/relay.yaml", "kvindex-relay", "../kubernetes/vllm/deployment.yaml"),
	}
	if data, err := os.ReadFile("networkpolicy.yaml"); err == nil {
		s.Policy = &networkingv1.NetworkPolicy{}
		if err := yaml.UnmarshalStrict(data, s.Policy); err != nil {
			t.Fatalf("networkpolicy.yaml: %v", err)
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}
	for _, f := range []string{"../kubernetes/replicas/deployment.yaml", "../kubernetes/components/relay-sidecar/relay.yaml"} {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var doc any
		if err := yaml.Unmarshal(data, &doc); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		n := len(s.URLs)
		s.URLs = append(s.URLs, natsArgs(doc)...)
		if len(s.URLs) == n {
			t.Fatalf("%s: no --nats= argument", f)
		}
	}
	return s
}

// loadClient reads the container named name of the Deployment in file,
// and its pod's labels from the Deployment in podFile.
func loadClient(t *testing.T, file, name, podFile string) client {
	t.Helper()
	read := func(f string) *appsv1.Deployment {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var d appsv1.Deployment
		if err := yaml.UnmarshalStrict(data, &d); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		return &d
	}
	c := client{Labels: read(podFile).Spec.Template.Labels}
	d := read(file)
	i := slices.IndexFunc(d.Spec.Template.Spec.Containers, func(c corev1.Container) bool { return c.Name == name })
	if i < 0 {
		t.Fatalf("%s: no container %s", file, name)
	}
	for _, e := range d.Spec.Template.Spec.Containers[i].Env {
		switch e.Name {
		case service.EnvNATSUser:
			c.User = e.Value
		case service.EnvNATSPassword:
			if e.ValueFrom != nil {
				c.Password = e.ValueFrom.SecretKeyRef
			}
		}
	}
	return c
}

// natsArgs lists the values of every "--nats=" string in a decoded YAML
// document.
func natsArgs(doc any) []string {
	var out []string
	switch d := doc.(type) {
	case string:
		if u, ok := strings.CutPrefix(d, "--nats="); ok {
			out = append(out, u)
		}
	case []any:
		for _, e := range d {
			out = append(out, natsArgs(e)...)
		}
	case map[string]any:
		for _, e := range d {
			out = append(out, natsArgs(e)...)
		}
	}
	return out
}

// The client port the chart's Service exposes (config.nats.port, not set
// here).
const clientPort = "4222"

// problems lists every rule v breaks, given the replicas' stream settings.
func problems(v values, s streamSettings) []string {
	var out []string
	add := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }

	for _, u := range s.URLs {
		p, err := url.Parse(u)
		if err != nil || p.Scheme != "nats" {
			add("--nats=%s: not a nats:// URL", u)
			continue
		}
		port := p.Port()
		if port == "" {
			port = clientPort
		}
		// The chart names its Service after the release, or this.
		if p.Hostname() != v.FullnameOverride || port != clientPort {
			add("--nats=%s: the chart's Service is %s:%s (fullnameOverride)", u, v.FullnameOverride, clientPort)
		}
	}

	js := v.Config.JetStream
	if !js.Enabled || !js.FileStore.Enabled {
		add("JetStream with a file store is off (config.jetstream.enabled, fileStore.enabled)")
	}
	if !js.FileStore.PVC.Enabled {
		add("config.jetstream.fileStore.pvc.enabled is false: the stream would not survive a server's restart")
	}
	pvc, errP := resource.ParseQuantity(js.FileStore.PVC.Size)
	maxSize, errM := resource.ParseQuantity(js.FileStore.MaxSize)
	switch {
	case errP != nil:
		add("config.jetstream.fileStore.pvc.size %q: %v", js.FileStore.PVC.Size, errP)
	case errM != nil:
		add("config.jetstream.fileStore.maxSize %q: %v", js.FileStore.MaxSize, errM)
	default:
		if maxSize.Cmp(pvc) > 0 {
			add("config.jetstream.fileStore.maxSize %s exceeds the volume, pvc.size %s", js.FileStore.MaxSize, js.FileStore.PVC.Size)
		}
		// Each server keeps a copy of the stream and of the snapshots.
		need := s.MaxBytes + int64(s.SnapshotKeep)*s.MemoryBudget
		if maxSize.Value() < need {
			add("config.jetstream.fileStore.maxSize %s holds less than the stream (nats-max-bytes, %d B) and %d snapshots of at most memory-budget (%d B): %d B",
				js.FileStore.MaxSize, s.MaxBytes, s.SnapshotKeep, s.MemoryBudget, need)
		}
	}

	c := v.Config.Cluster
	if !c.Enabled || c.Replicas < 3 || c.Replicas%2 == 0 {
		add("config.cluster: enabled %v, replicas %d; want an odd number of at least 3 servers for a quorum that survives one's loss", c.Enabled, c.Replicas)
	}
	if c.Replicas < s.Replicas {
		add("config.cluster.replicas %d: fewer servers than the stream's replicas (nats-replicas %d)", c.Replicas, s.Replicas)
	}

	img := v.Container.Image
	if img.Repository == "" || img.Tag == "" || img.Tag == "latest" || strings.HasPrefix(img.Tag, "latest-") {
		add("container.image %s:%s: pin the server's version", img.Repository, img.Tag)
	}
	res := v.Container.Merge.Resources
	if res == nil || res.Limits.Memory().IsZero() || res.Requests.Memory().IsZero() {
		add("container.merge.resources: give memory requests and limits")
	} else if gml, err := parseGoMemLimit(v.Container.Env["GOMEMLIMIT"].Value); err != nil || gml <= 0 || gml >= res.Limits.Memory().Value() {
		add("container.env.GOMEMLIMIT %q: give one below the memory limit %s", v.Container.Env["GOMEMLIMIT"].Value, res.Limits.Memory())
	}
	if !v.Config.Monitor.Enabled {
		add("config.monitor is off: no /healthz, /varz, /jsz for the exporter and operators")
	}
	if !v.PodDisruptionBudget.Enabled {
		add("podDisruptionBudget is off: a drain may take the stream's quorum")
	}
	if len(v.PodTemplate.TopologySpreadConstraints) == 0 {
		add("podTemplate.topologySpreadConstraints: none, so servers may share a node")
	}

	// Pod Security "restricted": the pod's and every container's part.
	psc := v.PodTemplate.Merge.Spec.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser == 0 ||
		psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		add("podTemplate.merge.spec.securityContext: Pod Security restricted needs runAsNonRoot, a non-root runAsUser and seccompProfile RuntimeDefault")
	}
	containers := []struct {
		name    string
		enabled bool
		merge   containerMerge
	}{
		{"container", true, v.Container.Merge},
		{"reloader", v.Reloader.Enabled, v.Reloader.Merge},
		{"promExporter", v.PromExporter.Enabled, v.PromExporter.Merge},
	}
	for _, ctr := range containers {
		sc := ctr.merge.SecurityContext
		if ctr.enabled && (sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
			sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") || len(sc.Capabilities.Add) > 0) {
			add("%s.merge.securityContext: Pod Security restricted needs allowPrivilegeEscalation false and capabilities drop ALL", ctr.name)
		}
	}
	if v.NatsBox.Enabled {
		add("natsBox is on: its pod runs as root, which Pod Security restricted refuses")
	}
	out = append(out, authorizationProblems(v, s)...)
	return append(out, policyProblems(s)...)
}

func TestValues(t *testing.T) {
	data, err := os.ReadFile("values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems(loadValues(t, data), loadStream(t)) {
		t.Error(p)
	}
}

// Each change breaks one rule; the checks must report it.
func TestValuesChecksFail(t *testing.T) {
	data, err := os.ReadFile(filepath.Clean("values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	stream := loadStream(t)
	if p := problems(loadValues(t, data), stream); len(p) > 0 {
		t.Fatalf("values.yaml itself has problems: %v", p)
	}
	cases := []struct {
		name   string
		mutate func(*values, *streamSettings)
		want   string
	}{
		{"JetStream off", func(v *values, _ *streamSettings) { v.Config.JetStream.Enabled = false }, "JetStream"},
		{"memory store only", func(v *values, _ *streamSettings) { v.Config.JetStream.FileStore.Enabled = false }, "file store"},
		{"no volume", func(v *values, _ *streamSettings) { v.Config.JetStream.FileStore.PVC.Enabled = false }, "pvc.enabled"},
		{"volume smaller than the store", func(v *values, _ *streamSettings) { v.Config.JetStream.FileStore.PVC.Size = "10Gi" }, "exceeds the volume"},
		{"store smaller than the stream", func(v *values, _ *streamSettings) { v.Config.JetStream.FileStore.MaxSize = "60Gi" }, "holds less than the stream"},
		{"stream grown past the store", func(_ *values, s *streamSettings) { s.MaxBytes = 100 << 30 }, "holds less than the stream"},
		{"bad size", func(v *values, _ *streamSettings) { v.Config.JetStream.FileStore.PVC.Size = "100GiB" }, "pvc.size"},
		{"no cluster", func(v *values, _ *streamSettings) { v.Config.Cluster.Enabled = false }, "config.cluster"},
		{"two servers", func(v *values, _ *streamSettings) { v.Config.Cluster.Replicas = 2 }, "config.cluster"},
		{"more stream replicas than servers", func(_ *values, s *streamSettings) { s.Replicas = 5 }, "nats-replicas"},
		{"latest image", func(v *values, _ *streamSettings) { v.Container.Image.Tag = "latest" }, "pin"},
		{"no resources", func(v *values, _ *streamSettings) { v.Container.Merge.Resources = nil }, "resources"},
		{"GOMEMLIMIT above the limit", func(v *values, _ *streamSettings) { v.Container.Env["GOMEMLIMIT"] = envValue{Value: "9GiB"} }, "GOMEMLIMIT"},
		{"GOMEMLIMIT in Kubernetes units", func(v *values, _ *streamSettings) { v.Container.Env["GOMEMLIMIT"] = envValue{Value: "7Gi"} }, "GOMEMLIMIT"},
		{"no monitor", func(v *values, _ *streamSettings) { v.Config.Monitor.Enabled = false }, "monitor"},
		{"no disruption budget", func(v *values, _ *streamSettings) { v.PodDisruptionBudget.Enabled = false }, "podDisruptionBudget"},
		{"no spread", func(v *values, _ *streamSettings) { v.PodTemplate.TopologySpreadConstraints = nil }, "topologySpreadConstraints"},
		{"root pod", func(v *values, _ *streamSettings) { *v.PodTemplate.Merge.Spec.SecurityContext.RunAsUser = 0 }, "podTemplate.merge.spec.securityContext"},
		{"reloader escalates", func(v *values, _ *streamSettings) { v.Reloader.Merge.SecurityContext = nil }, "reloader.merge.securityContext"},
		{"exporter keeps capabilities", func(v *values, _ *streamSettings) {
			v.PromExporter.Merge.SecurityContext.Capabilities.Drop = nil
		}, "promExporter.merge.securityContext"},
		{"nats-box", func(v *values, _ *streamSettings) { v.NatsBox.Enabled = true }, "natsBox"},
		{"another Service name", func(v *values, _ *streamSettings) { v.FullnameOverride = "kvindex-nats" }, "fullnameOverride"},
		{"another port", func(_ *values, s *streamSettings) { s.URLs = []string{"nats://nats:4223"} }, "fullnameOverride"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v, s := loadValues(t, data), stream
			s.URLs = slices.Clone(stream.URLs)
			c.mutate(&v, &s)
			got := problems(v, s)
			if !slices.ContainsFunc(got, func(p string) bool { return strings.Contains(p, c.want) }) {
				t.Errorf("problems %q, want one mentioning %q", got, c.want)
			}
		})
	}
}

// A key the 1.x chart does not have fails the decoding, so a value
// silently ignored by Helm (here the 0.x chart's name for the file store)
// cannot pass.
func TestValuesStrict(t *testing.T) {
	for _, bad := range []string{
		"config:\n  jetstream:\n    fileStorage:\n      size: 10Gi\n",
		"nats:\n  jetstream:\n    enabled: true\n",
		"cluster:\n  enabled: true\n",
	} {
		var v values
		if err := yaml.UnmarshalStrict([]byte(bad), &v); err == nil {
			t.Errorf("%q decoded without error", bad)
		}
	}
}

// parseGoMemLimit reads GOMEMLIMIT as the Go runtime does: bytes, or a
// number with B, KiB, MiB, GiB or TiB (not Kubernetes' Gi, nor kvindex's
// decimal units).
func parseGoMemLimit(s string) (int64, error) {
	for _, u := range []struct {
		suffix string
		shift  uint
	}{{"TiB", 40}, {"GiB", 30}, {"MiB", 20}, {"KiB", 10}, {"B", 0}} {
		if n, ok := strings.CutSuffix(s, u.suffix); ok {
			v, err := strconv.ParseInt(n, 10, 64)
			return v << u.shift, err
		}
	}
	return strconv.ParseInt(s, 10, 64)
}
