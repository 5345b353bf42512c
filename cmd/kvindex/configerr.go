package main

import (
	"github.com/kvindex/kvindex/api/server"
	"github.com/kvindex/kvindex/api/server/security"
	"github.com/kvindex/kvindex/internal/configerr"
	"github.com/spf13/pflag"
)

// configUsage renders a configuration error of the packages kvindex is
// built from with each setting named by its flag in names (or by its own
// name if names has none): a bad setting is a usage error, one that
// failed when used (a port taken) a runtime error. The message is the
// configuration error's alone, without what may wrap it (a lifecycle
// part's name): the setting it names says where it arose. Any other error
// is returned as it is.
func configUsage(err error, names map[configerr.Field]string) error {
	ce, ok := configerr.As(err)
	if !ok {
		return err
	}
	msg := ce.Render(func(f configerr.Field) string { return names[f] })
	if ce.Usage() {
		return usageError{msg: msg}
	}
	return renderedError{msg: msg, err: ce}
}

// renderedError is a runtime error naming flags; it wraps what it renders.
type renderedError struct {
	msg string
	err error
}

func (e renderedError) Error() string { return e.msg }
func (e renderedError) Unwrap() error { return e.err }

// serveFlagNames are the flags of the index service's settings: the
// fields of service.Options and of the libraries' configurations it
// reports.
var serveFlagNames = map[configerr.Field]string{
	"GRPCAddr":             "--grpc-addr",
	"HTTPAddr":             "--http-addr",
	"AdminAddr":            "--admin-addr",
	"Model":                "--model",
	"Engines":              "--engine",
	"Listen":               "--listen",
	"ListenRanks":          "--listen-ranks",
	"TopicPattern":         "--topic-pattern",
	"ReplayTemplate":       "--replay-template",
	"EngineAllow":          "--engine-allow",
	"MaxEngines":           "--max-engines",
	"ForgetAfter":          "--forget-after",
	"MaxQueryTokens":       "--max-query-tokens",
	"ReadyGrace":           "--ready-grace",
	"StateDir":             "--state-dir",
	"SnapshotInterval":     "--snapshot-interval",
	"TokenizeURL":          "--tokenize-url",
	"TokenizerFile":        "--tokenizer",
	"ChatTemplateFile":     "--chat-template",
	"NATS":                 "--nats",
	"Tracing.Endpoint":     "--otlp-endpoint",
	"NATSAuthKey":          "--nats-auth-key",
	"NATSInsecure":         "--nats-insecure",
	"NATSCreds":            "--nats-creds",
	"NATS.Snapshot.Bucket": "--snapshot-bucket",
	"Discover":             "--discover-selector",
	"Discover.Namespace":   "--discover-namespace",
	"Discover.Grace":       "--discover-grace",
	"Discover.Endpoint":    "--discover-endpoint",
	"Discover.Replay":      "--discover-replay",
	"Discover.Ranks":       "--discover-ranks",
	"Discover.Metrics":     "--discover-metrics",
	"Picker.ExtProcAddr":   "--extproc-addr",
	"Picker.Endpoints":     "--endpoint",
	"Picker.UnknownModel":  "--unknown-model",
	"ScrapeInterval":       "--scrape-interval",
	"Index":                "--index",
	"Index.MemoryBudget":   "--memory-budget",
	// The server's and its security's settings.
	server.FieldMaxTokens:         "--max-query-tokens",
	server.FieldMaxTokensInFlight: "--max-tokens-in-flight",
	security.FieldCertFile:        "--tls-cert",
	security.FieldKeyFile:         "--tls-key",
	security.FieldClientCAFile:    "--tls-client-ca",
	security.FieldAuthFile:        "--auth-tokens",
}

// flagNames names settings that packages call by their flag's name (the
// demo's, flagsource's) by the flags of fs.
func flagNames(fs *pflag.FlagSet) map[configerr.Field]string {
	names := map[configerr.Field]string{}
	fs.VisitAll(func(f *pflag.Flag) { names[configerr.Field(f.Name)] = "--" + f.Name })
	return names
}
