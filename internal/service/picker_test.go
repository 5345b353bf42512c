package service

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvindex/kvindex/internal/configerr"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/picker/gateway"
)

// The picker on its own asks a remote kvindex: the prompt an engine
// stored is routed to that engine's endpoint; stopped, it leaves no
// goroutine behind.
func TestPickerServiceRoutesByTheRemoteIndex(t *testing.T) {
	ea, eca := newEngine(t, "pod-a")
	eb, ecb := newEngine(t, "pod-b")
	s := startService(t, baseOptions(eca, ecb))
	warmUp(t, s, "pod-a", ea)
	warmUp(t, s, "pod-b", eb)
	p := testutil.Seq(5000, 6*testBlockSize)
	if _, err := eb.Process(p, nil); err != nil {
		t.Fatal(err)
	}
	s.awaitHeld(t, "pod-b", p)

	before := runtime.NumGoroutine()
	o := &PickerServiceOptions{
		Picker: PickerOptions{Gateway: gateway.Config{Endpoints: []gateway.Endpoint{
			{Pod: "pod-a", Addr: "10.0.0.1:8000"}, {Pod: "pod-b", Addr: "10.0.0.2:8000"},
		}, IndexTimeout: testDeadline}, ExtProcAddr: "127.0.0.1:0"},
		Index: s.GRPCAddr(), Dial: []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())},
		DialTimeout: testDeadline, HTTPAddr: "127.0.0.1:0",
	}
	log, _ := testLogger(t)
	pk, err := NewPicker(o, log)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := pk.Start(ctx); err != nil {
		cancel()
		t.Fatal(err)
	}
	body := fmt.Sprintf(`{"model":%q,"prompt":%s}`, testModel, strings.ReplaceAll(fmt.Sprint(p), " ", ","))
	resp, err := http.Post("http://"+pk.HTTPAddr()+"/v1/pick", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var d struct{ Endpoint, Pod string }
	if err := json.Unmarshal(raw, &d); err != nil || resp.StatusCode != http.StatusOK || d.Pod != "pod-b" || d.Endpoint != "10.0.0.2:8000" {
		t.Fatalf("/v1/pick: %d %s; pod-b=10.0.0.2:8000 holds the prompt", resp.StatusCode, raw)
	}
	if pk.ExtProcAddr() == "" {
		t.Error("no ext_proc address")
	}
	cancel()
	if err := pk.Wait(); err != nil {
		t.Errorf("picker stop: %v", err)
	}
	goroutines(t, before)
}

// An index that cannot be dialled is a setting that failed when used.
func TestPickerServiceIndexUnreachable(t *testing.T) {
	o := &PickerServiceOptions{
		Picker:      PickerOptions{Gateway: gateway.Config{Endpoints: []gateway.Endpoint{{Pod: "a", Addr: "10.0.0.1:8000"}}}, ExtProcAddr: "127.0.0.1:0"},
		Index:       "127.0.0.1:1",
		Dial:        []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())},
		DialTimeout: testDeadline,
	}
	log, _ := testLogger(t)
	pk, err := NewPicker(o, log)
	if err != nil {
		t.Fatal(err)
	}
	err = pk.Run(context.Background())
	if ce, ok := configerr.As(err); !ok || ce.Field != "Index" || ce.Usage() {
		t.Fatalf("Run: %v, want Index failing", err)
	}
}
