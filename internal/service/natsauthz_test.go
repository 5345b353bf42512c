package service

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	deploynats "github.com/kvindex/kvindex/deploy/nats"
	"github.com/kvindex/kvindex/internal/snapstore"
	"github.com/kvindex/kvindex/internal/statefile"
	"github.com/kvindex/kvindex/internal/testutil"
	"github.com/kvindex/kvindex/kvevents"
	"github.com/kvindex/kvindex/kvevents/natstransport"
	"github.com/kvindex/kvindex/kvevents/zmqtransport"
)

// NATS mode on a server configured with deploy/nats/values.yaml's
// authorization, rendered as the Helm chart renders it: the relay and
// replica users can do all that kvindex relay and serve do, and nothing
// of what the other role does; a client without a user is refused.

// The users of deploy/nats/values.yaml that kvindex relay and serve
// connect as (deploy/kubernetes gives them as NATS_USER).
const (
	relayUser   = "relay"
	replicaUser = "replica"
)

// authorizedNATS runs an embedded server on the configuration the chart
// makes of values.yaml (with a loopback port and a JetStream directory
// added), each user's password in the environment variable values.yaml
// names, and returns its URL and the passwords by user.
func authorizedNATS(t *testing.T) (string, map[string]string) {
	t.Helper()
	users, err := deploynats.Users(deploynats.Values)
	if err != nil {
		t.Fatal(err)
	}
	passwords := map[string]string{}
	for _, u := range users {
		// The recipe deploy/README.md gives: a letter, then hex.
		b := make([]byte, 24)
		if _, err := rand.Read(b); err != nil {
			t.Fatal(err)
		}
		passwords[u.Name] = "p" + hex.EncodeToString(b)
		t.Setenv(u.PasswordEnv(), passwords[u.Name])
	}
	dir := t.TempDir()
	conf, err := deploynats.ServerConfig(deploynats.Values, map[string]any{
		"host": "127.0.0.1", "port": -1, "jetstream": map[string]any{"store_dir": filepath.Join(dir, "js")},
	})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "nats.conf")
	if err := os.WriteFile(path, conf, 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(path)
	if err != nil {
		t.Fatalf("the chart's configuration of values.yaml: %v\n%s", err, conf)
	}
	opts.NoSigs, opts.NoLog = true, true
	s := runNATS(t, opts)
	for _, u := range []string{relayUser, replicaUser} {
		if passwords[u] == "" {
			t.Fatalf("values.yaml has no user %q", u)
		}
	}
	return fmt.Sprintf("nats://127.0.0.1:%d", s.Addr().(*net.TCPAddr).Port), passwords
}

// A relay and replicas connected as values.yaml's users do their whole
// work: publish, consume, hold the lease, write a snapshot, and start a
// new replica from it. Not one request of theirs is refused.
func TestNATSAuthorizationRelayAndReplicas(t *testing.T) {
	url, pw := authorizedNATS(t)
	conn := func(user string) NATSConn {
		c := natsConn(t, url)
		c.User, c.Password = user, pw[user]
		return c
	}
	e, ec := newEngine(t, "vllm-a")
	_, relayLogs := startRelayConn(t, conn(relayUser), []zmqtransport.EngineConfig{ec}, nil)
	a, b := startReplicaConn(t, conn(replicaUser)), startReplicaConn(t, conn(replicaUser))
	var held [][]uint64
	for i := 0; len(held) < 3; i++ {
		p := testutil.Seq(i*1000+1, 3*testBlockSize)
		if _, err := e.Process(p, nil); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			a.awaitHeld(t, "vllm-a", p)
		}
		held = append(held, p)
	}
	for _, r := range []*started{a, b} {
		for _, p := range held {
			r.awaitHeld(t, "vllm-a", p)
		}
	}
	var holder *started
	await(t, "one lease holder", func() bool {
		la, lb := strings.Contains(a.logs.String(), "writer lease acquired"), strings.Contains(b.logs.String(), "writer lease acquired")
		holder = map[bool]*started{true: a, false: b}[la]
		return la != lb
	})
	holder.stop(t)
	if !strings.Contains(holder.logs.String(), `msg="final snapshot written"`) {
		t.Fatalf("the stopping lease holder wrote no final snapshot:\n%s", holder.logs.String())
	}
	c := startReplicaConn(t, conn(replicaUser))
	if !strings.Contains(c.logs.String(), `msg="snapshot restored"`) {
		t.Errorf("the new replica did not start from a snapshot:\n%s", c.logs.String())
	}
	for _, p := range held {
		c.awaitHeld(t, "vllm-a", p)
	}
	for name, logs := range map[string]*testutil.SyncBuffer{"relay": relayLogs, "replica a": a.logs, "replica b": b.logs, "replica c": c.logs} {
		if strings.Contains(logs.String(), "Permissions Violation") {
			t.Errorf("%s was refused a request:\n%s", name, logs.String())
		}
	}
}

// watched is a raw client of the server that records the permission
// errors the server sends it.
type watched struct {
	nc     *nats.Conn
	js     jetstream.JetStream
	denied *testutil.SyncBuffer
}

// dialAs connects as user, taking replies where kvindex's role does.
func dialAs(t *testing.T, url, role, user, password string) *watched {
	t.Helper()
	w := &watched{denied: &testutil.SyncBuffer{}}
	nc, err := nats.Connect(url, nats.UserInfo(user, password), nats.CustomInboxPrefix(InboxPrefix(role)),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			fmt.Fprintln(w.denied, err)
		}))
	if err != nil {
		t.Fatalf("%s: %v", user, err)
	}
	t.Cleanup(nc.Close)
	w.nc = nc
	if w.js, err = jetstream.New(nc); err != nil {
		t.Fatal(err)
	}
	return w
}

// refusedPublish publishes to subject and waits for the server to refuse
// it.
func (w *watched) refusedPublish(t *testing.T, subject string) {
	t.Helper()
	if err := w.nc.Publish(subject, []byte("x")); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("Permissions Violation for Publish to %q", subject)
	await(t, "refusal of "+subject, func() bool { return strings.Contains(w.denied.String(), want) })
}

// What each role may not do, and what only the other may, tried with raw
// clients: a relay user cannot read the stream, wipe it, or write a
// snapshot, its pointer or the lease; a replica user cannot write events
// or heartbeats, nor wipe the stream; nobody gets in without a user.
func TestNATSAuthorizationRoles(t *testing.T) {
	url, pw := authorizedNATS(t)
	ctx, cancel := context.WithTimeout(context.Background(), testDeadline)
	defer cancel()

	for _, bad := range []struct{ name, user, password string }{
		{"no user", "", ""},
		{"wrong password", relayUser, pw[replicaUser]},
		{"unknown user", "admin", pw[relayUser]},
	} {
		opts := []nats.Option{nats.NoReconnect()}
		if bad.user != "" {
			opts = append(opts, nats.UserInfo(bad.user, bad.password))
		}
		nc, err := nats.Connect(url, opts...)
		if err == nil {
			nc.Close()
			t.Errorf("%s: connected", bad.name)
		} else if !errors.Is(err, nats.ErrAuthorization) {
			t.Errorf("%s: %v, want an authorization violation", bad.name, err)
		}
	}

	relay, replica := dialAs(t, url, RoleRelay, relayUser, pw[relayUser]), dialAs(t, url, RoleReplica, replicaUser, pw[replicaUser])
	stream := natstransport.StreamConfig{Name: natstransport.DefaultStream}
	if _, err := natstransport.EnsureStream(ctx, relay.js, stream, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatalf("the relay user cannot create the stream: %v", err)
	}

	// The replica hears heartbeats; the relay's event (a pod name that
	// needs escaping) is acknowledged by the stream.
	beats := make(chan *nats.Msg, 1)
	sub, err := replica.nc.ChanSubscribe(natstransport.HeartbeatPrefix+".>", beats)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := replica.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	hb := natstransport.HeartbeatSubject(testModel, "relay-1")
	if err := relay.nc.Publish(hb, []byte("{}")); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-beats:
		if m.Subject != hb {
			t.Errorf("heartbeat on %s, want %s", m.Subject, hb)
		}
	case <-ctx.Done():
		t.Fatal("the replica user heard no heartbeat from the relay user")
	}
	engine := kvevents.EngineID{Model: testModel, Pod: "vllm.0 *", DPRank: 1}
	if _, err := relay.js.Publish(ctx, natstransport.BatchSubject(engine), []byte("batch")); err != nil {
		t.Fatalf("the relay user cannot publish an event: %v", err)
	}

	// The replica keeps snapshots: more than it keeps (older ones are
	// deleted and their chunks purged), read back whole, and the lease.
	// A snapshot of 8 MiB is read under JetStream's flow control, whose
	// replies a replica must be allowed to send (without them the read
	// stalls after 2 MiB).
	const size = 8 << 20
	cfg := snapstore.Config{Bucket: snapstore.DefaultBucket, Model: testModel, Keep: 1}
	store, err := snapstore.Open(ctx, replica.js, cfg, nil)
	if err != nil {
		t.Fatalf("the replica user cannot open the snapshot buckets: %v", err)
	}
	for seq := uint64(1); seq <= 3; seq++ {
		h := &statefile.Header{Written: time.Now().UTC(), Hashing: hashingOf(testHasher.Config()), Stream: stream.Name, StreamSeq: seq}
		if _, err := store.Put(ctx, h, func(w io.Writer) error { _, err := w.Write(make([]byte, size)); return err }); err != nil {
			t.Fatalf("the replica user cannot write snapshot %d: %v", seq, err)
		}
	}
	var read int64
	h, err := store.Load(ctx, func(_ *statefile.Header, body io.Reader) error {
		read, err = io.Copy(io.Discard, body)
		return err
	})
	if err != nil || h.StreamSeq != 3 || read != size {
		t.Fatalf("the replica user reads snapshot %v (%d bytes), %v; want the third (%d bytes)", h, read, err, size)
	}
	lease := store.Lease("replica-1")
	if ok, err := lease.TryAcquire(ctx); !ok || err != nil {
		t.Fatalf("the replica user cannot take the lease: %v, %v", ok, err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatalf("the replica user cannot release the lease: %v", err)
	}

	pointers, leases := snapstore.KVBuckets(snapstore.DefaultBucket)
	api := "$JS.API."
	for _, c := range []struct {
		who     *watched
		subject string
	}{
		// The relay: no snapshot, pointer or lease; no wiping or reading
		// of the stream; no bucket of its own making.
		{relay, "$KV." + pointers + "." + natstransport.EscapeToken(testModel) + ".latest"},
		{relay, "$KV." + leases + "." + natstransport.EscapeToken(testModel) + ".lease"},
		{relay, "$O." + snapstore.DefaultBucket + ".M.x"},
		{relay, api + "STREAM.PURGE." + stream.Name},
		{relay, api + "STREAM.DELETE." + stream.Name},
		{relay, api + "STREAM.MSG.DELETE." + stream.Name},
		{relay, api + "CONSUMER.CREATE." + stream.Name + ".c.kvevents.>"},
		{relay, api + "STREAM.CREATE.KV_" + pointers},
		// The replica: no events, resets or heartbeats; no wiping of
		// the stream or the buckets.
		{replica, natstransport.BatchSubject(engine)},
		{replica, natstransport.HeartbeatSubject(testModel, "forged")},
		{replica, api + "STREAM.PURGE." + stream.Name},
		{replica, api + "STREAM.DELETE." + stream.Name},
		{replica, api + "STREAM.MSG.DELETE." + stream.Name},
		{replica, api + "STREAM.UPDATE." + stream.Name},
		{replica, api + "STREAM.DELETE.OBJ_" + snapstore.DefaultBucket},
	} {
		c.who.refusedPublish(t, c.subject)
	}
	// Neither reads the other's traffic: not the stream, not the other
	// role's replies.
	for _, c := range []struct {
		who     *watched
		subject string
	}{
		{relay, natstransport.SubjectPrefix + ".>"},
		{relay, InboxPrefix(RoleReplica) + ".>"},
		{relay, "_INBOX.>"},
		{replica, InboxPrefix(RoleRelay) + ".>"},
	} {
		if _, err := c.who.nc.SubscribeSync(c.subject); err != nil {
			t.Fatal(err)
		}
		want := fmt.Sprintf("Permissions Violation for Subscription to %q", c.subject)
		await(t, "refusal of a subscription to "+c.subject, func() bool { return strings.Contains(c.who.denied.String(), want) })
	}
}

// Where relay and serve take their NATS user from, and the combinations
// they refuse.
func TestNATSCredentials(t *testing.T) {
	env := func(kv ...string) func(string) (string, bool) {
		return func(k string) (string, bool) {
			for i := 0; i+1 < len(kv); i += 2 {
				if kv[i] == k {
					return kv[i+1], true
				}
			}
			return "", false
		}
	}
	for _, c := range []struct {
		name           string
		conn           NATSConn
		env            func(string) (string, bool)
		user, password string
		err            string
	}{
		{"none", NATSConn{URL: "nats://n:4222"}, env(), "", "", ""},
		{"environment", NATSConn{URL: "nats://n:4222"}, env(EnvNATSUser, "relay", EnvNATSPassword, "pw"), "relay", "pw", ""},
		{"own over environment", NATSConn{URL: "nats://n:4222", User: "replica", Password: "own"},
			env(EnvNATSUser, "relay", EnvNATSPassword, "pw"), "replica", "own", ""},
		{"user without password", NATSConn{URL: "nats://n:4222"}, env(EnvNATSUser, "relay"), "", "", "give both"},
		{"password without user", NATSConn{URL: "nats://n:4222"}, env(EnvNATSPassword, "pw"), "", "", "give both"},
		{"and a credentials file", NATSConn{URL: "nats://n:4222", Creds: "x.creds"}, env(EnvNATSUser, "relay", EnvNATSPassword, "pw"), "", "", "NATSCreds"},
		{"and a user in the URL", NATSConn{URL: "nats://a:4222,nats://u:secret@b:4222"}, env(EnvNATSUser, "relay", EnvNATSPassword, "pw"), "", "", "names a user"},
		{"a user in the URL only", NATSConn{URL: "nats://u:secret@b:4222"}, env(), "", "", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			user, password, err := c.conn.credentials(c.env)
			switch {
			case c.err == "" && err != nil:
				t.Fatalf("error %v", err)
			case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
				t.Fatalf("error %v, want one with %q", err, c.err)
			case user != c.user || password != c.password:
				t.Fatalf("user %q password %q, want %q %q", user, password, c.user, c.password)
			}
			if err != nil && strings.Contains(err.Error(), "secret") {
				t.Errorf("the error shows the URL's password: %v", err)
			}
		})
	}
}

// A password in the URL never reaches a log line or message.
func TestNATSConnRedacted(t *testing.T) {
	for url, want := range map[string]string{
		"nats://n:4222":                        "nats://n:4222",
		"nats://u:secret@a:4222,nats://b:4222": "nats://u:xxxxx@a:4222,nats://b:4222",
		"nats://token@a:4222":                  "nats://xxxxx@a:4222",
	} {
		if got := (NATSConn{URL: url}).Redacted(); got != want {
			t.Errorf("%s: %s, want %s", url, got, want)
		}
	}
}
