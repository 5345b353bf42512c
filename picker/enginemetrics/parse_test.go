package enginemetrics_test

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/picker/enginemetrics"
)

func TestParse(t *testing.T) {
	const qwen = "Qwen/Qwen2.5-7B-Instruct"
	tests := []struct {
		file    string
		want    enginemetrics.Reading
		wantErr string // a substring of the error; "" for none
		is      error  // the error Parse must wrap, if any
	}{
		{file: "vllm-0.11-dp2.txt", want: enginemetrics.Reading{
			Waiting: 7, Running: 7, KVUsage: 0.5,
			Prefix: map[string]enginemetrics.Counters{qwen: {Queries: 4000, Hits: 2400}},
		}},
		{file: "vllm-0.10-both-names.txt", want: enginemetrics.Reading{
			Running: 1, KVUsage: 0.5,
			Prefix: map[string]enginemetrics.Counters{"zai-org/GLM-4.5": {Queries: 32, Hits: 16}},
		}},
		{file: "vllm-0.9-gpu-names.txt", want: enginemetrics.Reading{
			Waiting: 1, Running: 2, KVUsage: 0.125,
			Prefix: map[string]enginemetrics.Counters{"meta-llama/Llama-3.1-8B-Instruct": {Queries: 512, Hits: 128}},
		}},
		{file: "no-total-suffix.txt", want: enginemetrics.Reading{
			Waiting: 4, Running: 8, KVUsage: 0.9,
			Prefix: map[string]enginemetrics.Counters{"m": {Queries: 2048, Hits: 1024}},
		}},
		{file: "untyped-two-models.txt", want: enginemetrics.Reading{
			Waiting: 3,
			Prefix: map[string]enginemetrics.Counters{
				"a": {Queries: 100, Hits: 10}, "b": {Queries: 200, Hits: 20}, "": {Queries: 50},
			},
		}},
		{file: "not-vllm.txt", is: enginemetrics.ErrNoMetrics, wantErr: "no vLLM engine metrics"},
		{file: "garbage.txt", wantErr: "parse"},
		{file: "negative.txt", wantErr: "want a finite value >= 0"},
		{file: "nan.txt", wantErr: "want a finite value >= 0"},
		{file: "histogram-name.txt", wantErr: "want a counter or gauge"},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			f, err := os.Open(filepath.Join("testdata", tt.file))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			got, err := enginemetrics.Parse(f)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Parse: error %v, want one containing %q", err, tt.wantErr)
				}
				if tt.is != nil && !errors.Is(err, tt.is) {
					t.Fatalf("Parse: error %v is not %v", err, tt.is)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("Parse:\n got %+v\nwant %+v", got, tt.want)
			}
		})
	}
}
