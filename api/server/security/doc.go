// Package security is who may call kvindex's server and how it proves
// itself to them: its TLS certificate, the client CAs, and the auth file
// of bearer tokens and certificate identities with their scopes and
// tenants. Named security rather than auth because half of it is TLS (the
// listeners' configurations, and the certificate files reloaded when
// they change), the half that authenticates the server; and after the
// Config it holds, the server's Config.Security and api/README.md's
// Security section.
//
// It holds the policy and the files, not the wiring: Config and its
// Check; LoadCerts, the TLS configuration of each listener; LoadPolicy,
// the auth file's model (Scope, Grant, Policy); Authorize, the decision
// for one request (a Grant, or a Refusal saying what to count, log and
// answer), and the tenant rules of a Grant (CheckPrompt, WatchLoRAs);
// Reloader, which loads files again when they change. Package server
// reads the callers' credentials, asks Authorize from its gRPC
// interceptors and HTTP guards, and turns a Refusal into a status and a
// metric.
//
// Errors in the settings are *configerr.Error naming Config's fields
// (FieldCertFile, ...), which the kvindex command names by its flags.
package security
