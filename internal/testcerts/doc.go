// Package testcerts makes the certificates of the TLS tests at test time:
// a CA, server certificates for loopback and client certificates carrying
// the identities kvindex's auth file matches (subject CN, SAN DNS, SAN
// URI), all ECDSA P-256, written to a test's temporary directory. Only
// tests import this package.
package testcerts
