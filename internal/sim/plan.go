package sim

import (
	"net"
	"slices"
	"strconv"
	"strings"

	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/internal/configerr"
)

// Plan is a checked configuration laid out: the engines' names and the
// endpoints each rank binds or connects to. Planning starts nothing.
type Plan struct {
	opts Options
	// connectMode: the engines bind their event sockets and kvindex
	// connects to them (false: bind mode, they connect to connect).
	connectMode bool
	connect     string // bind mode: kvindex's endpoint, with its scheme
	replay      bool
	replayPort  int // the first replay port, default resolved
	pods        []string
	// pubs and replays are the event and replay endpoints per engine,
	// then per rank.
	pubs, replays [][]string
	// https are the engines' HTTP addresses (host:port), with HTTPPort.
	https []string
}

// NewPlan checks o and lays out its engines.
func NewPlan(o Options) (*Plan, error) {
	if err := o.check(); err != nil {
		return nil, err
	}
	p := &Plan{opts: o, connectMode: o.Connect == "", replay: !o.NoReplay, replayPort: o.ReplayPort}
	// Connect mode: engine i rank r binds port + i*ranks + r on 127.0.0.1.
	// Bind mode: engine i is the host 127.0.0.<i+1> (Linux answers on all
	// of 127/8), named by it as llm-d names engines by pod IP, so that
	// kvindex admits each only from its own address and finds its replay
	// socket from a template tcp://{addr}:PORT; rank r replays on PORT + r.
	perHost := o.Engines * o.Ranks
	if p.connectMode {
		if err := checkPorts(fieldPort, o.Port, perHost); err != nil {
			return nil, err
		}
	} else {
		perHost = o.Ranks
		if o.Engines > maxHosts {
			return nil, configerr.New(fieldEngines, "%v %d: bind mode runs engine i on 127.0.0.<i+1>, so at most %d", fieldEngines, o.Engines, maxHosts)
		}
		var err error
		if p.connect, err = connectEndpoint(o.Connect); err != nil {
			return nil, err
		}
	}
	if p.replay {
		if p.replayPort == 0 {
			p.replayPort = o.Port + perHost
			if !p.connectMode {
				// The port after kvindex's.
				_, port, _ := net.SplitHostPort(strings.TrimPrefix(p.connect, "tcp://"))
				listen, _ := strconv.Atoi(port)
				p.replayPort = listen + 1
			}
		}
		if err := checkPorts(fieldReplayPort, p.replayPort, perHost); err != nil {
			return nil, err
		}
		if p.connectMode && p.replayPort < o.Port+perHost && o.Port < p.replayPort+perHost {
			return nil, configerr.New(fieldReplayPort, "%v %d and %v %d overlap: %d engine ranks use event ports %s and replay ports %s; vLLM adds the rank to both, so the two ranges must be apart (e.g. %v %d)",
				fieldPort, o.Port, fieldReplayPort, p.replayPort, perHost, portRange(o.Port, perHost), portRange(p.replayPort, perHost), fieldReplayPort, o.Port+perHost)
		}
	}
	if err := p.checkHTTP(perHost); err != nil {
		return nil, err
	}
	for i := range o.Engines {
		pod, host, base := "pod-"+strconv.Itoa(i), "127.0.0.1", i*o.Ranks
		if !p.connectMode {
			pod, host, base = "127.0.0."+strconv.Itoa(i+1), "127.0.0."+strconv.Itoa(i+1), 0
		}
		var pubs, replays []string
		for r := range o.Ranks {
			if p.connectMode {
				pubs = append(pubs, "tcp://"+host+":"+strconv.Itoa(o.Port+base+r))
			} else {
				pubs = append(pubs, p.connect)
			}
			if p.replay {
				replays = append(replays, "tcp://"+host+":"+strconv.Itoa(p.replayPort+base+r))
			}
		}
		p.pods = append(p.pods, pod)
		p.pubs, p.replays = append(p.pubs, pubs), append(p.replays, replays)
		if o.HTTPPort != 0 {
			port := o.HTTPPort
			if p.connectMode {
				port += i
			}
			p.https = append(p.https, net.JoinHostPort(host, strconv.Itoa(port)))
		}
	}
	return p, nil
}

// checkHTTP checks HTTPPort: in connect mode the engines' HTTP ports
// follow one another on 127.0.0.1, apart from the event and replay ports;
// in bind mode each engine has its own host and they share the port.
func (p *Plan) checkHTTP(perHost int) error {
	o := &p.opts
	if o.HTTPPort == 0 {
		return nil
	}
	n := 1
	if p.connectMode {
		n = o.Engines
	}
	if err := checkPorts(fieldHTTPPort, o.HTTPPort, n); err != nil {
		return err
	}
	if !p.connectMode {
		return nil
	}
	for _, r := range []struct {
		field configerr.Field
		first int
		used  bool
	}{{fieldPort, o.Port, true}, {fieldReplayPort, p.replayPort, p.replay}} {
		if r.used && o.HTTPPort < r.first+perHost && r.first < o.HTTPPort+n {
			return configerr.New(fieldHTTPPort, "%v %d overlaps %v %d: %d engines serve HTTP on ports %s, %d engine ranks use ports %s",
				fieldHTTPPort, o.HTTPPort, r.field, r.first, n, portRange(o.HTTPPort, n), perHost, portRange(r.first, perHost))
		}
	}
	return nil
}

// checkPorts checks that n ports from first exist.
func checkPorts(field configerr.Field, first, n int) error {
	if first < 1 || first+n-1 > 65535 {
		return configerr.New(field, "%v %d: %d engine ranks need ports %s, beyond 1..65535", field, first, n, portRange(first, n))
	}
	return nil
}

func portRange(first, n int) string {
	if n == 1 {
		return strconv.Itoa(first)
	}
	return strconv.Itoa(first) + "-" + strconv.Itoa(first+n-1)
}

// connectEndpoint checks a bind-mode endpoint: tcp://HOST:PORT (the
// scheme may be left out), returned with its scheme.
func connectEndpoint(s string) (string, error) {
	ep := s
	if !strings.Contains(ep, "://") {
		ep = "tcp://" + ep
	}
	rest, ok := strings.CutPrefix(ep, "tcp://")
	host, port, err := net.SplitHostPort(rest)
	n, perr := strconv.Atoi(port)
	if !ok || err != nil || host == "" || host == "*" || perr != nil || n < 1 || n > 65535 {
		return "", configerr.New(fieldConnect, "%v %q: want tcp://HOST:PORT, where a kvindex serve %v binds (e.g. tcp://127.0.0.1:5557)", fieldConnect, s, ServeListen)
	}
	return ep, nil
}

// Options returns the options planned.
func (p *Plan) Options() Options { return p.opts }

// Pods returns the engines' names: pod-0, pod-1, ... in connect mode,
// their hosts 127.0.0.1, 127.0.0.2, ... in bind mode.
func (p *Plan) Pods() []string { return slices.Clone(p.pods) }

// Follow is what a kvindex serve needs to follow the engines: their model
// and hashing, the tokenizer of their prompts, and either each engine's
// endpoints (connect mode) or where to listen for them (bind mode).
type Follow struct {
	Model     string
	Hash      blockhash.Config
	Tokenizer string // "": the prompts are token ids
	// Engines, in connect mode, are the engines, by their rank 0's
	// endpoints: rank r is at both ports + r.
	Engines []FollowEngine
	// Listen, in bind mode, is the endpoint kvindex binds for the
	// engines to connect to, and ReplayTemplate where it finds an
	// engine's replay socket, {addr} standing for the address its events
	// come from, rank r at the port + r ("" without replay).
	Listen, ReplayTemplate string
	// EngineAllow, in bind mode on loopback, is the engine allow rule
	// that admits the engines: every pod is named by its loopback
	// address, and a pod so named may speak only from it.
	EngineAllow []string
}

// FollowEngine is one engine a kvindex connects to.
type FollowEngine struct {
	Pod      string
	Endpoint string
	Replay   string // "": none
	Ranks    int
}

// Follow returns what a kvindex serve needs to follow the engines.
func (p *Plan) Follow() Follow {
	o := &p.opts
	f := Follow{Model: o.Model, Hash: o.Hasher.Config(), Tokenizer: o.Tokenizer}
	if !p.connectMode {
		f.Listen = listenEndpoint(p.connect)
		if p.replay {
			f.ReplayTemplate = "tcp://{addr}:" + strconv.Itoa(p.replayPort)
		}
		if f.Listen == p.connect {
			f.EngineAllow = []string{"*=127.0.0.0/8"}
		}
		return f
	}
	for i, pod := range p.pods {
		e := FollowEngine{Pod: pod, Endpoint: p.pubs[i][0], Ranks: o.Ranks}
		if p.replay {
			e.Replay = p.replays[i][0]
		}
		f.Engines = append(f.Engines, e)
	}
	return f
}

// listenEndpoint is where kvindex binds for engines connecting to ep: the
// same address on a loopback host, every interface otherwise.
func listenEndpoint(ep string) string {
	host, port, _ := net.SplitHostPort(strings.TrimPrefix(ep, "tcp://"))
	if ip := net.ParseIP(host); host == "localhost" || ip != nil && ip.IsLoopback() {
		return ep
	}
	return "tcp://*:" + port
}
