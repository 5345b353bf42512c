package main

import (
	"os/signal"
	"strconv"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/internal/bytesize"
	"github.com/kvindex/kvindex/internal/memlimit"
	"github.com/kvindex/kvindex/internal/service"
)

// pickerFlags are the flags of kvindex picker: where the index is, the
// picker's own flags (shared with kvindex serve --picker), its HTTP
// address, and serve's conveniences (--config, --log-*, --check).
type pickerFlags struct {
	config   string
	index    string
	pick     pickFlags
	httpAddr string
	sec      clientSecurityFlags
	discover discoverFlags
	budget   bytesize.Value
	tok      tokenizerFlags
	tokModel string
	log      logFlags
	check    bool
}

func (f *pickerFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&f.config, "config", "", "YAML file of settings keyed by flag name (e.g. index: kvindex:50051); the command line and KVINDEX_* variables override it")
	fs.StringVar(&f.index, "index", client.DefaultAddr, "address of the kvindex gRPC API to ask: HOST[:PORT]; the picker starts without it and connects when it answers")
	f.pick.register(fs)
	fs.StringVar(&f.httpAddr, "http-addr", ":9003", "address of the HTTP server: POST /v1/pick, /metrics, /healthz and /readyz (ready once the index answers); empty: none")
	f.sec.register(fs, "--index")
	f.discover.register(fs, false, true)
	memoryBudgetFlag(fs, &f.budget, "memory the picker may use", "Its tokenizer's cache gets 1/"+strconv.Itoa(memlimit.TokenShareDiv)+" of it (at most "+bytesize.Format(memlimit.DefaultTokenCacheBytes)+"). ")
	f.tok.register(fs)
	fs.StringVar(&f.tokModel, "tokenizer-model", "", "with --tokenizer: the model it tokenizes for; other models' prompts go to the index as text (default: every model's)")
	f.log.register(fs)
	fs.BoolVar(&f.check, "check", false, "validate the settings (flags, KVINDEX_* variables, --config file), print them and exit without listening or connecting")
}

func newPickerCmd() *cobra.Command {
	var f pickerFlags
	cmd := &cobra.Command{
		Use:   "picker --index HOST:PORT (--endpoint POD=HOST:PORT ... | --discover-selector LABELS)",
		Short: "Pick the engine for each inference request, for Envoy (ext_proc) or any gateway (HTTP)",
		Long: `picker is an endpoint picker for gateways. For each inference request it asks
kvindex (--index) which pods hold the prompt's prefix, scores the pods
(--endpoint) on the cached prefix, the requests it has in flight on each, the
session and the turn's priority, and says where the request goes.

Envoy and the gateways built on it (Envoy Gateway, Envoy AI Gateway, kgateway,
Istio, NGINX Gateway Fabric) call it over ext_proc on --extproc-addr, as the
Gateway API Inference Extension's Endpoint Picker Protocol defines: the
request's headers and body (OpenAI /v1/completions, /v1/chat/completions or
the Responses API) in, the header x-gateway-destination-endpoint and the
envoy.lb dynamic metadata out (and kvindex.picker's index_seq: the index
sequence of the answer the pick scored), honouring the gateway's subset
hint; 503 when no endpoint may serve. Other gateways POST the request body to /v1/pick on
--http-addr and read the same decision as JSON.

On Kubernetes, --discover-selector replaces --endpoint: the Ready pods the
selector picks are the candidates, each at the host:port of its
--discover-metrics URL (vLLM serves /metrics on its API port).

Headers: x-session-id names the conversation (else the Responses API's
previous_response_id does); x-request-priority: background marks a turn
nobody waits on.

The index is asked within a deadline that grows with the prompt:
--index-timeout + --index-timeout-per-1k x tokens / 1000 (text and chat
count bytes / 4 as tokens; 2ms + 0.25ms per 1k by default: 6ms for 16k
tokens). A request carrying token ids is sent as the block keys the
picker computes with the index's own hashing (learnt from the index at
each connection; token ids when it cannot). With --tokenizer (and
--chat-template) text and chat prompts are tokenized in the picker and go
so too, not as text for the index to tokenize; a form (completion, chat)
whose ids differ from an endpoint's /tokenize, checked at start, and
requests the template cannot render exactly (content parts, their own
chat_template) go as text (kvindex_picker_local_tokenize_total, WARN
naming the first differing id). A request routed without its
answer (by load and session) says why in the header x-kvindex-fallback:
timeout, index_unreachable, unknown_model, tokenizer, overloaded or error.
The picker starts without its index, reports not ready until it answers,
and warms each new connection to it before using it.

Every flag can also be set in a YAML --config file, keyed by flag name;
flags on the command line override the file.`,
		Example: `  kvindex picker --index kvindex:50051 \
      --endpoint pod-a=10.0.0.5:8000 --endpoint pod-b=10.0.0.6:8000
  curl -s localhost:9003/v1/pick -H 'x-session-id: s1' \
      -d '{"model":"Qwen/Qwen2.5-7B-Instruct","messages":[{"role":"user","content":"hi"}]}'`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o, err := f.options()
			if err != nil {
				return err
			}
			log, err := f.log.logger(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			if f.check {
				return configUsage(service.CheckPicker(cmd.OutOrStdout(), o), serveFlagNames)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			p, err := service.NewPicker(o, log)
			if err == nil {
				err = p.Run(ctx)
			}
			return configUsage(err, serveFlagNames)
		},
	}
	f.register(cmd.Flags())
	return cmd
}

// options turns the flags into the picker service's options.
func (f *pickerFlags) options() (*service.PickerServiceOptions, error) {
	disc, err := f.discover.options()
	if err != nil {
		return nil, err
	}
	o := &service.PickerServiceOptions{HTTPAddr: f.httpAddr, Discover: disc, MemoryBudget: int64(f.budget),
		TokenizerFile: f.tok.file, ChatTemplateFile: f.tok.chatTemplate, TokenizerModel: f.tokModel}
	if err := f.pick.Options(disc != nil, &o.Picker); err != nil {
		return nil, configUsage(err, serveFlagNames)
	}
	cf := clientFlags{server: f.index, sec: f.sec}
	o.Index, o.Dial, err = cf.target()
	return o, err
}
