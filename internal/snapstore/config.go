package snapstore

import (
	"fmt"
	"regexp"
	"time"

	"github.com/kvindex/kvindex/kvevents/natstransport"
)

// Defaults of Config (and of serve's --snapshot-bucket and --snapshot-keep).
const (
	DefaultBucket   = "kvindex-snapshots"
	DefaultKeep     = 2
	DefaultLeaseTTL = 15 * time.Second
	DefaultReplicas = 1
)

// Names of the KV buckets next to the object store bucket Bucket.
const (
	metaSuffix  = "-meta"  // the pointers: no TTL
	leaseSuffix = "-lease" // the leases: bucket TTL = LeaseTTL
)

// KVBuckets are the names of the KV buckets that go with the Object Store
// bucket: the pointers' and the leases'.
func KVBuckets(bucket string) (pointers, leases string) {
	return bucket + metaSuffix, bucket + leaseSuffix
}

// minLeaseTTL keeps a mistyped TTL from making the lease expire between
// two renewals of a healthy holder.
const minLeaseTTL = time.Second

// Config configures a Store. A zero field takes its default.
type Config struct {
	// Bucket is the Object Store bucket holding the snapshots; the KV
	// buckets Bucket-meta (pointers) and Bucket-lease (writer leases) go
	// with it.
	Bucket string
	// Model is the model whose index is snapshotted (required): every
	// model's snapshots, pointer and lease are its own.
	Model string
	// Keep is how many snapshots of the model are kept, the newest first;
	// more than one lets a reader fall back when the newest is unusable.
	Keep int
	// LeaseTTL is how long a writer lease outlives its holder's last
	// renewal. It is the lease bucket's TTL: a bucket created with another
	// TTL keeps its own, and the Store uses that.
	LeaseTTL time.Duration
	// Replicas is the buckets' replica count in a clustered JetStream.
	Replicas int
	// Auth, if set, signs every snapshot written (an HMAC of its bytes in
	// the object's metadata, metaMAC) and its pointer, and makes Load
	// refuse any snapshot whose code is missing or wrong, before its
	// content is used (see Verifier), and every reader ignore a pointer
	// whose code is: whoever may write to the buckets cannot have a
	// replica restore an index of their making, nor hold the real
	// snapshots off with a pointer far ahead.
	Auth *natstransport.Auth
}

// bucketName is what JetStream accepts as a bucket name.
var bucketName = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// withDefaults fills in the defaults and refuses what cannot work.
func (c Config) withDefaults() (Config, error) {
	if c.Bucket == "" {
		c.Bucket = DefaultBucket
	}
	if c.Keep == 0 {
		c.Keep = DefaultKeep
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = DefaultLeaseTTL
	}
	if c.Replicas == 0 {
		c.Replicas = DefaultReplicas
	}
	switch {
	case !bucketName.MatchString(c.Bucket):
		return c, fmt.Errorf("snapstore: bucket %q: only letters, digits, '-' and '_'", c.Bucket)
	case c.Model == "":
		return c, fmt.Errorf("snapstore: no model")
	case c.Keep < 1:
		return c, fmt.Errorf("snapstore: keep %d: at least 1", c.Keep)
	case c.LeaseTTL < minLeaseTTL:
		return c, fmt.Errorf("snapstore: lease TTL %v: at least %v", c.LeaseTTL, minLeaseTTL)
	case c.Replicas < 1 || c.Replicas > 5:
		return c, fmt.Errorf("snapstore: replicas %d: 1 to 5", c.Replicas)
	}
	return c, nil
}
