package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// When --ready-grace runs out before every engine connected, the log
// names the streams that did not, with their endpoints.
func TestServeReadyGraceNamesUnconnectedEngines(t *testing.T) {
	t.Parallel() // its own service and engines on free ports
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close() // nothing listens there now
	dead := "tcp://127.0.0.1:" + strconv.Itoa(port)
	x := startE2E(t, []string{"pod-a"}, "--engine", "dead="+dead+",ranks=2", "--ready-grace", "2s")
	var line string
	x.await("the log line naming the unconnected engines", func() bool {
		for _, l := range strings.Split(x.logs.String(), "\n") {
			if strings.Contains(l, "ready after grace period") {
				line = l
				return true
			}
		}
		return false
	})
	want := `count=2 not_connected="dead (` + dead + `), dead/1 (tcp://127.0.0.1:` + strconv.Itoa(port+1) + `)"`
	if !strings.Contains(line, "level=WARN") || !strings.Contains(line, want) || strings.Contains(line, "pod-a") {
		t.Errorf("log line %q, want a warning with %s and without the connected pod-a", line, want)
	}
}

// The Kubernetes example in deploy/ agrees with itself and with serve: its
// ConfigMap passes serve's checks, the Deployment and Service expose one
// event port per data-parallel rank, and the vLLM fleet connects to those
// ports and binds its replay ports where the replay template looks.
func TestDeployManifests(t *testing.T) {
	type port struct {
		Name          string `yaml:"name"`
		Port          int    `yaml:"port"`
		ContainerPort int    `yaml:"containerPort"`
		TargetPort    string `yaml:"targetPort"`
	}
	type manifest struct {
		Kind string            `yaml:"kind"`
		Data map[string]string `yaml:"data"`
		Spec struct {
			Ports    []port `yaml:"ports"`
			Template struct {
				Spec struct {
					Containers []struct {
						Args  []string `yaml:"args"`
						Ports []port   `yaml:"ports"`
					} `yaml:"containers"`
				} `yaml:"spec"`
			} `yaml:"template"`
		} `yaml:"spec"`
	}
	load := func(file string) []manifest {
		t.Helper()
		data, err := os.ReadFile(filepath.Join("../../deploy/kubernetes", file))
		if err != nil {
			t.Fatal(err)
		}
		var out []manifest
		dec := yaml.NewDecoder(bytes.NewReader(data))
		for {
			var m manifest
			if err := dec.Decode(&m); err == io.EOF {
				return out
			} else if err != nil {
				t.Fatalf("%s: %v", file, err)
			}
			out = append(out, m)
		}
	}
	portOf := func(ep string) int {
		t.Helper()
		p, err := strconv.Atoi(ep[strings.LastIndexByte(ep, ':')+1:])
		if err != nil {
			t.Fatalf("endpoint %q has no port", ep)
		}
		return p
	}

	raw := load("base/configmap.yaml")[0].Data["config.yaml"]
	cfg := writeFile(t, "config.yaml", raw)
	o, _, err := parseServe(t, "--config", cfg)
	if err != nil {
		t.Fatalf("the ConfigMap's settings: %v", err)
	}
	// The settings it shows commented out are valid too.
	optional := regexp.MustCompile(`(?m)^(\s*)# ([a-z-]+: .*)$`)
	if !optional.MatchString(raw) {
		t.Fatal("the ConfigMap shows no optional setting (the tracing example)")
	}
	if _, _, err := parseServe(t, "--config", writeFile(t, "optional.yaml", optional.ReplaceAllString(raw, "$1$2"))); err != nil {
		t.Fatalf("the ConfigMap's settings with the commented ones: %v", err)
	}
	listen, replay := portOf(o.Listen), portOf(o.ReplayTemplate)
	containerPorts := map[string]int{}
	for _, p := range load("base/deployment.yaml")[0].Spec.Template.Spec.Containers[0].Ports {
		containerPorts[p.Name] = p.ContainerPort
	}
	exposed := map[int]bool{}
	for _, p := range load("base/service.yaml")[0].Spec.Ports {
		if containerPorts[p.TargetPort] == p.Port {
			exposed[p.Port] = true
		}
	}
	for r := range o.ListenRanks {
		if !exposed[listen+r] {
			t.Errorf("rank %d's port %d: not a container port exposed by the Service on the same port", r, listen+r)
		}
	}

	vllm := load("vllm/deployment.yaml")[0].Spec.Template.Spec.Containers[0]
	ranks, events := 1, ""
	for _, a := range vllm.Args {
		if v, ok := strings.CutPrefix(a, "--data-parallel-size="); ok {
			if ranks, err = strconv.Atoi(v); err != nil {
				t.Fatal(err)
			}
		}
		if v, ok := strings.CutPrefix(a, "--kv-events-config="); ok {
			events = v
		}
	}
	var ev struct {
		Endpoint       string `json:"endpoint"`
		ReplayEndpoint string `json:"replay_endpoint"`
	}
	if err := json.Unmarshal([]byte(events), &ev); err != nil {
		t.Fatalf("--kv-events-config %q: %v", events, err)
	}
	if ranks > o.ListenRanks || portOf(ev.Endpoint) != listen || portOf(ev.ReplayEndpoint) != replay {
		t.Errorf("vLLM: %d ranks, events %s, replay %s; kvindex listens on %d for %d ranks and replays from %d",
			ranks, ev.Endpoint, ev.ReplayEndpoint, listen, o.ListenRanks, replay)
	}
	replayPorts := map[int]bool{}
	for _, p := range vllm.Ports {
		replayPorts[p.ContainerPort] = true
	}
	for r := range ranks {
		if !replayPorts[replay+r] {
			t.Errorf("vLLM rank %d's replay port %d is not a container port", r, replay+r)
		}
	}
}
