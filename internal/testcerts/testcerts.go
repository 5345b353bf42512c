package testcerts

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// CA is a certificate authority whose certificate is written to CertFile.
type CA struct {
	Cert     *x509.Certificate
	CertFile string
	key      *ecdsa.PrivateKey
	dir      string
	serial   int64
}

// NewCA makes a CA named name, written under dir.
func NewCA(t testing.TB, dir, name string) *CA {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	ca := &CA{Cert: cert, key: key, dir: dir, serial: 1}
	ca.CertFile = write(t, dir, name+"-ca.pem", pemBlock("CERTIFICATE", der))
	return ca
}

// Leaf describes a certificate to issue.
type Leaf struct {
	CN   string
	DNS  []string
	IPs  []net.IP
	URIs []string
	// Client makes a client certificate; otherwise a server one.
	Client bool
}

// Pair is an issued certificate's files.
type Pair struct {
	CertFile, KeyFile string
}

// Server issues a server certificate for 127.0.0.1 and localhost.
func (ca *CA) Server(t testing.TB, name string) Pair {
	t.Helper()
	return ca.Issue(t, name, Leaf{CN: name, DNS: []string{"localhost"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}})
}

// Client issues a client certificate with subject common name cn.
func (ca *CA) Client(t testing.TB, cn string) Pair {
	t.Helper()
	return ca.Issue(t, cn, Leaf{CN: cn, Client: true})
}

// Issue issues l, written as NAME.pem and NAME-key.pem.
func (ca *CA) Issue(t testing.TB, name string, l Leaf) Pair {
	t.Helper()
	ca.serial++
	key := newKey(t)
	usage := x509.ExtKeyUsageServerAuth
	if l.Client {
		usage = x509.ExtKeyUsageClientAuth
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(ca.serial),
		Subject:      pkix.Name{CommonName: l.CN},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		DNSNames:     l.DNS,
		IPAddresses:  l.IPs,
	}
	for _, u := range l.URIs {
		pu, err := url.Parse(u)
		if err != nil {
			t.Fatal(err)
		}
		tmpl.URIs = append(tmpl.URIs, pu)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return Pair{
		CertFile: write(t, ca.dir, name+".pem", pemBlock("CERTIFICATE", der)),
		KeyFile:  write(t, ca.dir, name+"-key.pem", pemBlock("PRIVATE KEY", kder)),
	}
}

// Install copies p's files over dst's, as a certificate rotation does.
func Install(t testing.TB, p, dst Pair) {
	t.Helper()
	for _, f := range [][2]string{{p.CertFile, dst.CertFile}, {p.KeyFile, dst.KeyFile}} {
		data, err := os.ReadFile(f[0])
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f[1], data, 0o600); err != nil {
			t.Fatal(err)
		}
		Touch(t, f[1])
	}
}

// touched makes each Touch's time later than the one before.
var touched atomic.Int64

// Touch sets path's modification time later than any Touch before, so
// that a reload that compares modification times sees a change even on a
// file system with coarse timestamps.
func Touch(t testing.TB, path string) {
	t.Helper()
	at := time.Now().Add(time.Duration(touched.Add(1)) * time.Second)
	if err := os.Chtimes(path, at, at); err != nil {
		t.Fatal(err)
	}
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

func write(t testing.TB, dir, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
