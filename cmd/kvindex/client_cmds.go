package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os/signal"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/api/kvindexv1"
	"github.com/kvindex/kvindex/internal/service"
)

// clientFlags are the connection settings of the commands that talk to a
// running kvindex.
type clientFlags struct {
	server  string
	timeout time.Duration
	sec     clientSecurityFlags
	addr    string // the gRPC target --server names, set by dial
}

func (f *clientFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&f.server, "server", client.DefaultAddr, "address of the kvindex gRPC API: HOST[:PORT] (port "+client.DefaultPort+" when omitted)")
	fs.DurationVar(&f.timeout, "timeout", 10*time.Second, "deadline for connecting and for the request")
	f.sec.register(fs, "--server")
}

// target is the gRPC target --server names (client.ParseTarget) and the
// dial options the flags ask for.
func (f *clientFlags) target() (string, []grpc.DialOption, error) {
	addr, useTLS, err := client.ParseTarget(f.server)
	if err != nil {
		return "", nil, usagef("%s %q: %v", f.sec.addrFlag, f.server, err)
	}
	opts, err := f.sec.dialOptions(useTLS)
	return addr, opts, err
}

// dial connects within the timeout.
func (f *clientFlags) dial(ctx context.Context) (*client.Client, error) {
	addr, opts, err := f.target()
	if err != nil {
		return nil, err
	}
	f.addr = addr
	dctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	c, err := client.Dial(dctx, addr, opts...)
	if err != nil && client.IsHTTP1Answer(err) {
		return nil, f.httpPortError()
	}
	if err != nil && dctx.Err() == nil {
		_, useTLS, _ := client.ParseTarget(f.server)
		switch e := client.TLSMismatch(dctx, addr, useTLS || f.sec.tls(), f.sec.cert != ""); e {
		case client.ErrServerSpeaksTLS:
			return nil, fmt.Errorf("cannot reach kvindex at %s: %v: add --tls-ca FILE, the CA of its certificate (or give %s https://HOST:PORT for a certificate the system trusts)", addr, e, f.sec.addrFlag)
		case client.ErrClientCertRequired:
			return nil, fmt.Errorf("cannot reach kvindex at %s: %v: add --tls-cert and --tls-key", addr, e)
		}
	}
	return c, err
}

// httpPortError says that --server names an HTTP port, most likely
// kvindex's own --http-addr.
func (f *clientFlags) httpPortError() error {
	return fmt.Errorf("--server %s answers HTTP/1.1, not gRPC: that looks like kvindex's HTTP port (--http-addr); the gRPC API is on --grpc-addr (default %s)",
		f.server, service.DefaultOptions().GRPCAddr)
}

// callError turns an RPC failure into the CLI's one line.
// call dials, makes one call within the timeout and closes; a failed
// call's error is explained by callError, a failed dial's by dial.
func (f *clientFlags) call(ctx context.Context, do func(context.Context, *client.Client) error) error {
	c, err := f.dial(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	cctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	if err := do(cctx, c); err != nil {
		return f.callError(err)
	}
	return nil
}

func (f *clientFlags) callError(err error) error {
	if problem, ok := client.TokenizerUnavailable(err); ok {
		return fmt.Errorf("kvindex at %s could not tokenize the prompt: %s", f.server, problem)
	}
	st := status.Convert(err)
	switch st.Code() {
	case codes.Unavailable:
		if client.IsHTTP1Answer(err) {
			return f.httpPortError()
		}
		return fmt.Errorf("cannot reach kvindex at %s: %s", f.addr, st.Message())
	case codes.DeadlineExceeded:
		return fmt.Errorf("kvindex at %s did not answer within %v", f.addr, f.timeout)
	}
	return fmt.Errorf("%s (%s)", st.Message(), st.Code())
}

// maxMessagesFile bounds a --messages-file.
const maxMessagesFile = 64 << 20

// promptFlags are the prompt inputs of query and lookup.
type promptFlags struct {
	model        string
	tokens       tokenFlags
	text         string
	messagesFile string
	extras       extraFlags
}

func (f *promptFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&f.model, "model", "", "model the prompt is for (default: the server's --model)")
	f.tokens.register(fs)
	fs.StringVar(&f.text, "prompt", "", "prompt text, tokenized by the server (completion form)")
	fs.StringVar(&f.messagesFile, "messages-file", "", `chat messages, tokenized by the server: a JSON array of OpenAI messages, or a chat request object (its messages, tools, chat_template_kwargs, ... are used); - reads stdin`)
	f.extras.register(fs)
	_ = fs.MarkHidden("legacy-mm") // a hashing detail of kvindex hash; the server decides
}

// build returns the prompt the flags describe; stdin is what a "-" file
// reads.
func (f *promptFlags) build(stdin io.Reader) (*kvindexv1.Prompt, error) {
	var given []string
	if f.tokens.set() {
		given = append(given, "--tokens/--tokens-file")
	}
	if f.text != "" {
		given = append(given, "--prompt")
	}
	if f.messagesFile != "" {
		given = append(given, "--messages-file")
	}
	switch len(given) {
	case 0:
		return nil, usagef("no prompt: give --tokens, --tokens-file, --prompt or --messages-file")
	case 1:
	default:
		return nil, usagef("give only one of %s", strings.Join(given, ", "))
	}
	if f.extras.legacyMM {
		return nil, usagef("--legacy-mm applies to kvindex hash only")
	}
	x, err := f.extras.extras()
	if err != nil {
		return nil, err
	}
	var p *kvindexv1.Prompt
	switch {
	case f.tokens.set():
		ids, err := f.tokens.load(stdin)
		if err != nil {
			return nil, err
		}
		p = client.TokensPrompt(ids)
	case f.text != "":
		p = client.TextPrompt(f.text)
	default:
		if p, err = readMessagesFile(f.messagesFile, stdin); err != nil {
			return nil, err
		}
	}
	p.LoraName, p.CacheSalt = x.LoRAName, x.CacheSalt
	for _, m := range x.MM {
		p.MmItems = append(p.MmItems, &kvindexv1.MultimodalItem{Identifier: m.Identifier, Offset: uint32(m.Offset), Length: uint32(m.Length)})
	}
	return p, nil
}

// readMessagesFile reads --messages-file (client.ParseChatPrompt: a JSON
// array of messages, or an OpenAI chat request object); "-" reads stdin.
func readMessagesFile(path string, stdin io.Reader) (*kvindexv1.Prompt, error) {
	data, err := readInput("--messages-file", path, stdin, maxMessagesFile)
	if err != nil {
		return nil, err
	}
	p, err := client.ParseChatPrompt(data)
	if err != nil {
		return nil, fmt.Errorf("--messages-file %s: %w", inputName(path), err)
	}
	return p, nil
}

func newQueryCmd() *cobra.Command {
	var (
		cf     clientFlags
		pf     promptFlags
		pods   podFilter
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "query (--tokens 1,2,3 | --tokens-file F | --prompt TEXT | --messages-file F)",
		Short: "Ask a running kvindex which pods hold a prompt's prefix",
		Long: `query asks a running kvindex, for each engine (pod, data-parallel rank), how
many leading blocks of the prompt it holds, and prints them, the longest first.

With --json it prints:
  {"blocks_total":N,"block_size":16,"prompt_tokens":N,"token_source":"caller",
   "pods":[{"pod":"a","dp_rank":0,"matched_blocks":2,"matched_tokens":32,
            "tiers":{"GPU":2},"hash_check":"verified","health":"ok"}]}
pods sorted by matched_blocks, descending.`,
		Example: `  kvindex query --model Qwen/Qwen2.5-7B-Instruct --tokens-file prompt.json
  kvindex query --model Qwen/Qwen2.5-7B-Instruct --prompt "You are a helpful assistant." --json
  kvindex query --server kvindex:50051 --messages-file chat.json --pod pod-a --pod pod-b`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			p, err := pf.build(cmd.InOrStdin())
			if err != nil {
				return err
			}
			if err := pods.validate(); err != nil {
				return err
			}
			var r *kvindexv1.LongestPrefixResponse
			if err := cf.call(cmd.Context(), func(ctx context.Context, c *client.Client) (err error) {
				r, err = c.LongestPrefix(ctx, pf.model, p, &client.QueryOptions{Candidates: pods})
				return err
			}); err != nil {
				return err
			}
			out := client.LongestPrefixJSONOf(r)
			sort.SliceStable(out.Pods, func(i, j int) bool { return out.Pods[i].MatchedBlocks > out.Pods[j].MatchedBlocks })
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(out)
			}
			return printQuery(cmd.OutOrStdout(), pf.model, out)
		},
	}
	cf.register(cmd.Flags())
	pf.register(cmd.Flags())
	pods.register(cmd.Flags(), "only this pod's engines; repeatable (default: every pod of the model)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// podFilter is the repeatable --pod flag of every command that filters by
// pod.
type podFilter []string

func (p *podFilter) register(fs *pflag.FlagSet, usage string) {
	fs.StringArrayVar((*[]string)(p), "pod", nil, usage)
}

func (p podFilter) validate() error {
	for _, name := range p {
		if name == "" {
			return usagef("--pod: empty pod name")
		}
	}
	return nil
}

// has reports whether the filter lets pod through (an empty filter lets
// every pod through).
func (p podFilter) has(pod string) bool { return len(p) == 0 || slices.Contains(p, pod) }

// indexSeqNote is ", index seq N" for an answer that reports its index
// sequence (a NATS-fed kvindex), else nothing.
func indexSeqNote(seq uint64) string {
	if seq == 0 {
		return ""
	}
	return ", index seq " + strconv.FormatUint(seq, 10)
}

func printQuery(w io.Writer, model string, r client.LongestPrefixJSON) error {
	promptTokens := r.PromptTokens
	what := fmt.Sprintf("%d tokens (%s)", r.PromptTokens, r.TokenSource)
	if r.TokenSource == client.SourceHashes {
		promptTokens = r.BlocksTotal * r.BlockSize
		what = "block hashes"
	}
	if model == "" {
		model = "(server default)"
	}
	fmt.Fprintf(w, "model %s: %s, %d full blocks of %d tokens%s\n", model, what, r.BlocksTotal, r.BlockSize, indexSeqNote(r.IndexSeq))
	if len(r.Pods) == 0 {
		_, err := fmt.Fprintln(w, "no engines of this model are known")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ENGINE\tBLOCKS\tTOKENS\tPROMPT\tTIERS\tHASH CHECK\tHEALTH")
	for _, p := range r.Pods {
		pct := "-"
		if promptTokens > 0 {
			pct = strconv.FormatFloat(100*float64(p.MatchedTokens)/float64(promptTokens), 'f', 1, 64) + "%"
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%s\t%s\n", client.EngineName(p.Pod, p.DPRank), p.MatchedBlocks, p.MatchedTokens, pct, client.FormatTiers(p.Tiers), p.HashCheck, p.Health)
	}
	return tw.Flush()
}

func newLookupCmd() *cobra.Command {
	var (
		cf     clientFlags
		pf     promptFlags
		pods   podFilter
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "lookup (--tokens 1,2,3 | --tokens-file F | --prompt TEXT | --messages-file F)",
		Short: "Show a prompt's blocks, their hashes and who holds each",
		Long: `lookup prints, block by block, the prompt's block hash (the 64-bit key engines
put in their events) and every engine holding it: pod, or pod/rank for a
data-parallel rank above 0, then the medium in brackets, e.g. pod-a[GPU].
--pod keeps only the holders of those pods.`,
		Example: `  kvindex lookup --model Qwen/Qwen2.5-7B-Instruct --tokens-file prompt.json
  kvindex lookup --prompt "Hello" --pod pod-a --json`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			p, err := pf.build(cmd.InOrStdin())
			if err != nil {
				return err
			}
			if err := pods.validate(); err != nil {
				return err
			}
			var r *kvindexv1.LookupResponse
			if err := cf.call(cmd.Context(), func(ctx context.Context, c *client.Client) (err error) {
				r, err = c.Lookup(ctx, pf.model, p, nil)
				return err
			}); err != nil {
				return err
			}
			out := client.LookupJSONOf(r)
			for i := range out.Blocks {
				out.Blocks[i].Holders = slices.DeleteFunc(out.Blocks[i].Holders, func(h client.HolderJSON) bool { return !pods.has(h.Pod) })
			}
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(out)
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "%d full blocks of %d tokens (%d tokens, %s)\n", len(out.Blocks), out.BlockSize, out.PromptTokens, out.TokenSource)
			tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "BLOCK\tHASH\tHOLDERS")
			for _, b := range out.Blocks {
				holders := make([]string, len(b.Holders))
				for i, h := range b.Holders {
					holders[i] = client.EngineName(h.Pod, h.DPRank) + "[" + h.Medium + "]"
				}
				hs := strings.Join(holders, " ")
				if hs == "" {
					hs = "-"
				}
				fmt.Fprintf(tw, "%d\t%d\t%s\n", b.Index, b.Hash, hs)
			}
			return tw.Flush()
		},
	}
	cf.register(cmd.Flags())
	pf.register(cmd.Flags())
	pods.register(cmd.Flags(), "only holders on this pod; repeatable (default: every pod)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func newPodsCmd() *cobra.Command {
	var (
		cf     clientFlags
		model  string
		pods   podFilter
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "pods",
		Short: "List the engines a running kvindex follows, with ingest health",
		Long: `pods lists every engine (pod, data-parallel rank) of the running kvindex: its
event endpoint, whether it is connected, its health (ok, restored, unconfirmed,
degraded, disconnected: how far kvindex vouches for its entries; see "Engine
health" in the documentation), the last sequence number applied, the gaps,
replays and resets seen, the blocks it holds in the index, the hash check
(verified: kvindex recomputes the engine's hashes; mismatch: it cannot, see
"hash mismatch" in the documentation; unknown: nothing checked yet), the age
of its last event and its lag (how long its last batch took from the engine's
stamp to the index; "-" when no batch carried a stamp). A kvindex with a local
tokenizer adds how it compares with the engines' /tokenize, per prompt form.
When kvindex runs the picker and scrapes the engines
(serve --picker), the last lines give the fleet cached fraction: the share of
prompt tokens the engines served from their prefix caches over the last
window, overall and per model, then each engine's own.`,
		Example: `  kvindex pods
  kvindex pods --server kvindex:50051 --model Qwen/Qwen2.5-7B-Instruct --json
  kvindex pods --pod pod-a --pod pod-b`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := pods.validate(); err != nil {
				return err
			}
			var r *kvindexv1.ListPodsResponse
			if err := cf.call(cmd.Context(), func(ctx context.Context, c *client.Client) (err error) {
				r, err = c.Index.ListPods(ctx, &kvindexv1.ListPodsRequest{Model: model})
				return err
			}); err != nil {
				return err
			}
			out := client.PodsJSONOf(r, time.Now())
			out.Pods = slices.DeleteFunc(out.Pods, func(p client.PodInfoJSON) bool { return !pods.has(p.Pod) })
			out.PodCache = slices.DeleteFunc(out.PodCache, func(p client.PodCacheJSON) bool { return !pods.has(p.Pod) })
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(out)
			}
			w := cmd.OutOrStdout()
			if out.IndexSeq > 0 {
				fmt.Fprintf(w, "index seq %d\n", out.IndexSeq)
			}
			if len(out.Pods) == 0 {
				_, err := fmt.Fprint(w, "no engines\n", out.TokenizerCheckLine(), out.CachedFractionLines())
				return err
			}
			tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "ENGINE\tMODEL\tENDPOINT\tCONNECTED\tHEALTH\tLAST SEQ\tGAPS\tREPLAYS OK/FAILED\tRESETS\tBLOCKS\tHASH CHECK\tLAST EVENT\tLAG")
			for _, p := range out.Pods {
				age := "never"
				switch {
				case p.LastEventAgeSeconds != nil:
					age = (time.Duration(*p.LastEventAgeSeconds * float64(time.Second))).Round(time.Second/10).String() + " ago"
				case p.Restored():
					age = "restored" // its entries came from a snapshot, its events before this process
				}
				lag := "-"
				if p.LastBatchLagSeconds != nil {
					lag = client.FormatLag(*p.LastBatchLagSeconds)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d/%d\t%d\t%d\t%s\t%s\t%s\n",
					client.EngineName(p.Pod, p.DPRank), p.Model, cmp.Or(p.Endpoint, "-"), yesNo(p.Connected), p.Health,
					p.LastSeq, p.Gaps, p.ReplaysOK, p.ReplaysFailed, p.Resets, p.Blocks, p.HashCheck, age, lag)
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			for _, p := range out.Pods {
				if p.Message != "" {
					fmt.Fprintf(w, "%s: %s\n", client.EngineName(p.Pod, p.DPRank), p.Message)
				}
			}
			_, err := io.WriteString(w, out.TokenizerCheckLine()+out.CachedFractionLines())
			return err
		},
	}
	cf.register(cmd.Flags())
	cmd.Flags().StringVar(&model, "model", "", "only this model's engines")
	pods.register(cmd.Flags(), "only this pod's engines; repeatable (default: every pod)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func newTailCmd() *cobra.Command {
	var (
		cf   clientFlags
		pods podFilter
	)
	cmd := &cobra.Command{
		Use:   "tail",
		Short: "Print the events a running kvindex applies, as it applies them",
		Long: `tail streams the KV-cache events kvindex applies, one line each:
  TIME ENGINE seq=N KIND n=HASHES first=HASH [parent=HASH] [tokens=N] [MEDIUM] [lora=NAME]
Resets (an engine restarted, cleared or was removed) print as "Reset reason=...".
When tail reads too slowly, kvindex ends the stream rather than skip events or
slow down, and tail exits 1 saying how far it fell behind. Ctrl-C ends it.`,
		Example: `  kvindex tail
  kvindex tail --server kvindex:50051 --pod pod-a --pod pod-b`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := pods.validate(); err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			c, err := cf.dial(ctx)
			if err != nil {
				return err
			}
			defer c.Close()
			if err := cf.checkPods(ctx, c, pods); err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			err = c.Watch(ctx, pods, func(ev *kvindexv1.WatchResponse) error {
				if n := ev.GetDropped(); n > 0 { // from servers that sent events with holes
					fmt.Fprintf(w, "... %d events dropped (tail read too slowly)\n", n)
				}
				_, err := io.WriteString(w, client.EventLine(ev))
				return err
			})
			if err != nil {
				return cf.callError(err)
			}
			return nil
		},
	}
	cf.register(cmd.Flags())
	pods.register(cmd.Flags(), "only this pod's events; repeatable (default: every pod)")
	return cmd
}

// checkPods refuses --pod names the server does not know, naming those it
// does: a misspelt pod would otherwise wait for events that never come.
func (f *clientFlags) checkPods(ctx context.Context, c *client.Client, pods podFilter) error {
	if len(pods) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	known, err := c.PodNames(ctx, "")
	if err != nil {
		return f.callError(err)
	}
	for _, name := range pods {
		if slices.Contains(known, name) {
			continue
		}
		if len(known) == 0 {
			return fmt.Errorf("--pod %q: kvindex at %s follows no engines yet (an engine in bind mode is known once it has published)", name, f.addr)
		}
		return fmt.Errorf("--pod %q: kvindex at %s follows no such pod; known pods: %s", name, f.addr, strings.Join(known, ", "))
	}
	return nil
}
