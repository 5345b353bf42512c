package sim

import (
	"cmp"
	"fmt"
	"io"
	"math"
	"net"
	"regexp"
	"strconv"
	"strings"

	"github.com/kvindex/kvindex/internal/service"
)

// WriteEvent writes what kvindex sim tells of ev: what runs where and how
// to follow it, then a line per request.
func WriteEvent(w io.Writer, p *Plan, ev Event) {
	switch ev := ev.(type) {
	case Started:
		writeStart(w, p, ev)
	case Request:
		fmt.Fprintf(w, "%s req %d conv %d turn %d -> %s: %d tokens, %d cached (%s)\n",
			ev.Time.Format("15:04:05.000"), ev.N, ev.Conv, ev.Turn+1, ev.Engine.Name(), ev.Tokens, ev.Cached, percent(ev.Cached, ev.Tokens))
	case HTTPRequest:
		// Tokenizations that succeed print nothing: kvindex serve
		// --tokenize-url sends one per query.
		now := ev.Time.Format("15:04:05.000")
		switch {
		case ev.Status != 200:
			fmt.Fprintf(w, "%s http %s -> %s: %d %s\n", now, ev.Path, ev.Pod, ev.Status, ev.Err)
		case ev.Engine != nil:
			fmt.Fprintf(w, "%s http %s -> %s: %d tokens, %d cached (%s)\n",
				now, ev.Path, ev.Engine.Name(), ev.PromptTokens, ev.CachedTokens, percent(ev.CachedTokens, ev.PromptTokens))
		}
	case Finished:
		fmt.Fprintf(w, "sent %d requests; the engines stay up (kvindex can still replay and query them) until Ctrl-C\n", ev.Requests)
	}
}

// percent writes part of whole as a percentage with one decimal.
func percent(part, whole int) string {
	pct := 0.0
	if whole > 0 {
		pct = 100 * float64(part) / float64(whole)
	}
	return strconv.FormatFloat(math.Round(pct*10)/10, 'f', 1, 64) + "%"
}

// writeStart says what runs where, and the kvindex serve line that
// follows it.
func writeStart(w io.Writer, p *Plan, st Started) {
	o := p.Options()
	hc := o.Hasher.Config()
	ranks := ""
	if o.Ranks > 1 {
		ranks = fmt.Sprintf(" x %d data-parallel ranks", o.Ranks)
	}
	fmt.Fprintf(w, "kvindex sim: %d simulated vLLM engines%s of %s (%d blocks of %d tokens each, hash %s seed %q)\n",
		o.Engines, ranks, o.Model, o.Capacity, hc.BlockSize, hc.Algo, hc.Seed)
	for _, e := range st.Engines {
		how := "publishes on " + e.PubEndpoint()
		if e.Topic != "" {
			how = "connects to " + e.PubEndpoint() + " (topic " + e.Topic + ")"
		}
		fmt.Fprintf(w, "  %s %s, replay %s\n", e.Name(), how, cmp.Or(e.ReplayEndpoint(), "none"))
	}
	if len(st.Fronts) > 0 {
		fmt.Fprintf(w, "vLLM's HTTP API (POST /v1/completions, /v1/chat/completions, /tokenize; GET /metrics, /v1/models, /health), %d requests at once per rank, prefill %v per uncached token:\n", o.MaxRunning, o.PrefillPerToken)
		for _, f := range st.Fronts {
			fmt.Fprintf(w, "  %s http://%s\n", f.Pod, f.Addr)
		}
	}
	prompts := "random token ids"
	if o.Tokenizer != "" {
		prompts = "text through " + o.Tokenizer
	}
	limit := "until Ctrl-C"
	if o.Requests > 0 {
		limit = strconv.Itoa(o.Requests) + " requests"
	}
	if o.Rate == 0 {
		fmt.Fprintf(w, "workload: none (--rate 0); prompts over HTTP are %s\n", map[bool]string{true: "text or token ids", false: "token ids"}[o.Tokenizer != ""])
	} else {
		fmt.Fprintf(w, "workload: %d conversations at a time sharing a system prompt, %d turns each, %v requests/s, %s; prompts are %s; seed %d\n",
			o.Sessions, o.Turns, o.Rate, limit, prompts, o.Seed)
	}
	if o.LogPrompts != "" {
		q := `kvindex query --prompt "$(tail -n 1 ` + ShellLine([]string{o.LogPrompts}) + `)"`
		if o.Tokenizer == "" {
			q = "tail -n 1 " + ShellLine([]string{o.LogPrompts}) + " | kvindex query --tokens-file -"
		}
		fmt.Fprintf(w, "prompts go to %s, one per line; ask about the last one with:\n  %s\n", o.LogPrompts, q)
	}
	fmt.Fprintf(w, "follow these engines with:\n%s\n", ShellLine(ServeArgs(p.Follow())))
}

// ServeArgs is the kvindex serve command line that follows the
// engines f describes.
func ServeArgs(f Follow) []string {
	args := []string{"kvindex", "serve", "--model", f.Model,
		"--hash-algo", string(f.Hash.Algo), "--hash-seed", f.Hash.Seed, "--block-size", strconv.Itoa(f.Hash.BlockSize)}
	if f.Tokenizer != "" {
		args = append(args, "--tokenizer", f.Tokenizer)
	}
	for _, e := range f.Engines {
		spec := e.Pod + "=" + e.Endpoint
		if e.Replay != "" {
			spec += ",replay=" + e.Replay
		}
		if e.Ranks > 1 {
			spec += ",ranks=" + strconv.Itoa(e.Ranks)
		}
		args = append(args, "--engine", spec)
	}
	if f.Listen != "" {
		args = append(args, "--listen", f.Listen)
	}
	if f.ReplayTemplate != "" {
		args = append(args, "--replay-template", f.ReplayTemplate)
	}
	for _, r := range f.EngineAllow {
		args = append(args, "--engine-allow", r)
	}
	if !strings.Contains(f.Listen, "*") {
		// The engines are on this machine, and so is whoever asks about
		// them: serve's API stays on loopback (its defaults listen on
		// every interface, as a pod's must).
		d := service.DefaultOptions()
		args = append(args, "--grpc-addr", loopback(d.GRPCAddr), "--http-addr", loopback(d.HTTPAddr))
	}
	return args
}

// loopback is addr's port on the loopback address.
func loopback(addr string) string {
	_, port, _ := net.SplitHostPort(addr)
	return net.JoinHostPort("127.0.0.1", port)
}

// shellSafe matches words a POSIX shell reads as themselves.
var shellSafe = regexp.MustCompile(`^[A-Za-z0-9_@%+=:,./-]+$`)

// ShellLine joins args into a line a shell reads back as args.
func ShellLine(args []string) string {
	out := make([]string, len(args))
	for i, a := range args {
		if shellSafe.MatchString(a) {
			out[i] = a
		} else {
			out[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
	}
	return strings.Join(out, " ")
}
