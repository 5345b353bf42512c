package nats

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/kvindex/kvindex/internal/service"
	"github.com/kvindex/kvindex/internal/snapstore"
	"github.com/kvindex/kvindex/kvevents/natstransport"
)

// The offline half of the authorization's checks: every user's
// permissions stay within what its role may at most be given, its password
// comes from a Secret the kvindex container of that role reads too, and
// the NetworkPolicy admits only kvindex's pods to the client port.
// internal/service's TestNATSAuthorization* run a real server on the
// chart's rendering of values.yaml and show that the permissions are
// enough for kvindex relay and serve.

// chartName is the NATS pods' app.kubernetes.io/name label: the chart's
// name (values.yaml sets no nameOverride).
const chartName = "nats"

// Ports of the NATS pods (the chart's defaults, which values.yaml keeps).
const (
	portClient   = 4222
	portCluster  = 6222
	portExporter = 7777
)

// mayPublish is the most a role may be allowed to publish to, requests to
// the JetStream API included: the relay its events and heartbeats and
// the stream's creation; the replica reading the stream and keeping the
// snapshot buckets, but no events, and no purge, update or delete of the
// stream.
func mayPublish(role string, s streamSettings) []string {
	const api = "$JS.API."
	if role == roleRelay {
		return []string{natstransport.SubjectPrefix + ".>", natstransport.HeartbeatPrefix + ".>",
			api + "STREAM.INFO." + s.Stream, api + "STREAM.CREATE." + s.Stream}
	}
	pointers, leases := snapstore.KVBuckets(s.Bucket)
	out := []string{api + "INFO", api + "STREAM.PURGE.OBJ_" + s.Bucket,
		"$O." + s.Bucket + ".>", "$KV." + pointers + ".>", "$KV." + leases + ".>"}
	for _, st := range []string{s.Stream, "OBJ_" + s.Bucket, "KV_" + pointers, "KV_" + leases} {
		out = append(out, api+"STREAM.INFO."+st, api+"STREAM.CREATE."+st, api+"STREAM.MSG.GET."+st,
			api+"DIRECT.GET."+st+".>", api+"CONSUMER.CREATE."+st+".>", api+"CONSUMER.MSG.NEXT."+st+".>",
			api+"CONSUMER.DELETE."+st+".>", "$JS.FC."+st+".>", "$JS.FC.*.*."+st+".>")
	}
	return out
}

// maySubscribe is the most a role may be allowed to subscribe to: replies
// to its own requests, and for the replica the relays' heartbeats.
func maySubscribe(role string) []string {
	inbox := service.InboxPrefix(role) + ".>"
	if role == roleRelay {
		return []string{inbox}
	}
	return []string{inbox, natstransport.HeartbeatPrefix + ".>"}
}

// within reports whether every subject that p matches, e matches too.
func within(p, e string) bool {
	pt, et := strings.Split(p, "."), strings.Split(e, ".")
	for i, tok := range et {
		switch {
		case tok == ">":
			return i < len(pt)
		case i >= len(pt) || pt[i] == ">":
			return false
		case tok == "*":
		case pt[i] != tok:
			return false
		}
	}
	return len(pt) == len(et)
}

func authorizationProblems(v values, s streamSettings) []string {
	var out []string
	add := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }
	auth := v.Config.Merge.Authorization
	if auth == nil || len(auth.Users) == 0 {
		return []string{"config.merge.authorization: no users, so any client may write events, wipe the stream or replace the snapshots"}
	}
	roleOf := map[string]string{}
	for role, c := range s.Roles {
		if c.User == "" {
			add("the %s's kvindex container has no NATS_USER", role)
			continue
		}
		roleOf[c.User] = role
	}
	for _, u := range auth.Users {
		role, ok := roleOf[u.Name]
		if !ok {
			add("config.merge.authorization: user %q is no kvindex container's NATS_USER", u.Name)
			continue
		}
		delete(roleOf, u.Name)
		env := u.PasswordEnv()
		if env == "" {
			add("user %q: the password is written out in the values; give \"<< $VAR >>\" and VAR from a Secret in container.env", u.Name)
		} else if ref := v.Container.Env[env].ValueFrom; ref == nil || ref.SecretKeyRef == nil {
			add("container.env.%s (user %q's password): not from a Secret (valueFrom.secretKeyRef)", env, u.Name)
		} else if c := s.Roles[role]; c.Password == nil || c.Password.Name != ref.SecretKeyRef.Name || c.Password.Key != ref.SecretKeyRef.Key {
			add("user %q: the server reads its password from Secret %s key %s, the %s's NATS_PASSWORD from %v", u.Name,
				ref.SecretKeyRef.Name, ref.SecretKeyRef.Key, role, c.Password)
		}
		for _, p := range u.Permissions.Publish.Allow {
			if !slices.ContainsFunc(mayPublish(role, s), func(e string) bool { return within(p, e) }) {
				add("user %q (%s) may publish to %q: beyond what the %s needs", u.Name, role, p, role)
			}
		}
		for _, p := range u.Permissions.Subscribe.Allow {
			if !slices.ContainsFunc(maySubscribe(role), func(e string) bool { return within(p, e) }) {
				add("user %q (%s) may subscribe to %q: beyond what the %s needs", u.Name, role, p, role)
			}
		}
		if len(u.Permissions.Publish.Allow) == 0 || len(u.Permissions.Subscribe.Allow) == 0 {
			add("user %q (%s): no publish or subscribe allow list, so everything is allowed", u.Name, role)
		}
		if role == roleRelay {
			for _, need := range []string{natstransport.SubjectPrefix + ".>", natstransport.HeartbeatPrefix + ".>"} {
				if !slices.Contains(u.Permissions.Publish.Allow, need) {
					add("user %q (relay) may not publish to %q: its events or heartbeats would be refused", u.Name, need)
				}
			}
		}
	}
	for user, role := range roleOf {
		add("the %s's NATS_USER %q is no user of config.merge.authorization", role, user)
	}
	return out
}

// selects reports whether sel matches set; an invalid or empty selector
// matches nothing here (empty would be every pod).
func selects(sel *metav1.LabelSelector, set map[string]string) bool {
	if sel == nil {
		return false
	}
	ls, err := metav1.LabelSelectorAsSelector(sel)
	return err == nil && !ls.Empty() && ls.Matches(labels.Set(set))
}

func policyProblems(s streamSettings) []string {
	p := s.Policy
	if p == nil {
		return []string{"networkpolicy.yaml is missing: any pod may reach the NATS servers"}
	}
	var out []string
	add := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }
	natsPods := map[string]string{"app.kubernetes.io/name": chartName}
	if !selects(&p.Spec.PodSelector, natsPods) {
		add("networkpolicy.yaml: the pod selector does not select the NATS pods (app.kubernetes.io/name: %s)", chartName)
	}
	if !slices.Contains(p.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) {
		add("networkpolicy.yaml: no Ingress policy type")
	}
	clients := map[string]bool{}
	routes := false
	for _, r := range p.Spec.Ingress {
		if len(r.Ports) == 0 || len(r.From) == 0 {
			add("networkpolicy.yaml: a rule without ports or sources admits every port or every source")
			continue
		}
		for _, port := range r.Ports {
			if port.Port == nil || port.Port.IntValue() == 0 {
				add("networkpolicy.yaml: port %v: give the number", port.Port)
				continue
			}
			for _, peer := range r.From {
				podOnly := peer.NamespaceSelector == nil && peer.IPBlock == nil
				switch n := port.Port.IntValue(); {
				case n == portClient && podOnly:
					matched := false
					for role, c := range s.Roles {
						if selects(peer.PodSelector, c.Labels) {
							clients[role], matched = true, true
						}
					}
					if !matched || selects(peer.PodSelector, natsPods) {
						add("networkpolicy.yaml: the client port %d admits pods other than kvindex's: %v", n, peer.PodSelector)
					}
				case n == portCluster && podOnly && selects(peer.PodSelector, natsPods):
					routes = true
				case n == portExporter && peer.IPBlock == nil && peer.NamespaceSelector != nil && len(peer.NamespaceSelector.MatchLabels)+len(peer.NamespaceSelector.MatchExpressions) > 0:
				default:
					add("networkpolicy.yaml: port %d admits %+v", n, peer)
				}
			}
		}
	}
	for role := range s.Roles {
		if !clients[role] {
			add("networkpolicy.yaml: the %s's pods cannot reach the client port %d", role, portClient)
		}
	}
	if !routes {
		add("networkpolicy.yaml: the servers cannot reach each other's cluster port %d", portCluster)
	}
	return out
}

// Each change breaks one rule of the authorization or the policy; the
// checks must report it.
func TestAuthorizationChecksFail(t *testing.T) {
	user := func(v *values, name string) *User {
		for i := range v.Config.Merge.Authorization.Users {
			if u := &v.Config.Merge.Authorization.Users[i]; u.Name == name {
				return u
			}
		}
		t.Fatalf("no user %s", name)
		return nil
	}
	allow := func(name, subject string) func(*values, *streamSettings) {
		return func(v *values, _ *streamSettings) {
			u := user(v, name)
			u.Permissions.Publish.Allow = append(u.Permissions.Publish.Allow, subject)
		}
	}
	rule := func(i int, f func(*networkingv1.NetworkPolicyIngressRule)) func(*values, *streamSettings) {
		return func(_ *values, s *streamSettings) { f(&s.Policy.Spec.Ingress[i]) }
	}
	cases := []struct {
		name   string
		mutate func(*values, *streamSettings)
		want   string
	}{
		{"no authorization", func(v *values, _ *streamSettings) { v.Config.Merge.Authorization = nil }, "no users"},
		{"relay publishes anything", allow("relay", ">"), `may publish to ">"`},
		{"relay moves the snapshot pointer", allow("relay", "$KV.kvindex-snapshots-meta.>"), "kvindex-snapshots-meta"},
		{"relay purges the stream", allow("relay", "$JS.API.STREAM.PURGE.KVEVENTS"), "STREAM.PURGE"},
		{"replica publishes events", allow("replica", "kvevents.>"), `"kvevents.>"`},
		{"replica deletes the stream", allow("replica", "$JS.API.STREAM.DELETE.KVEVENTS"), "STREAM.DELETE"},
		{"replica has the whole API", allow("replica", "$JS.API.>"), `"$JS.API.>"`},
		{"relay reads the replicas' replies", func(v *values, _ *streamSettings) {
			u := user(v, "relay")
			u.Permissions.Subscribe.Allow = []string{"_INBOX.>"}
		}, `"_INBOX.>"`},
		{"relay reads the stream", func(v *values, _ *streamSettings) {
			u := user(v, "relay")
			u.Permissions.Subscribe.Allow = append(u.Permissions.Subscribe.Allow, "kvevents.>")
		}, "subscribe"},
		{"relay without events", func(v *values, _ *streamSettings) {
			u := user(v, "relay")
			u.Permissions.Publish.Allow = slices.DeleteFunc(u.Permissions.Publish.Allow, func(s string) bool { return s == "kvevents.>" })
		}, "would be refused"},
		{"replica without limits", func(v *values, _ *streamSettings) { user(v, "replica").Permissions = Permissions{} }, "everything is allowed"},
		{"password in plain text", func(v *values, _ *streamSettings) { user(v, "relay").Password = "hunter2-hunter2" }, "written out"},
		{"password variable not from a Secret", func(v *values, _ *streamSettings) {
			v.Container.Env[user(v, "replica").PasswordEnv()] = envValue{Value: "hunter2"}
		}, "not from a Secret"},
		{"relay reads another Secret", func(_ *values, s *streamSettings) { s.Roles[roleRelay].Password.Name = "other" }, "NATS_PASSWORD"},
		{"relay without a user", func(_ *values, s *streamSettings) {
			c := s.Roles[roleRelay]
			c.User = ""
			s.Roles[roleRelay] = c
		}, "no NATS_USER"},
		{"relay user renamed in the values", func(v *values, _ *streamSettings) { user(v, "relay").Name = "relays" }, "is no user"},
		{"no network policy", func(_ *values, s *streamSettings) { s.Policy = nil }, "networkpolicy.yaml is missing"},
		{"client port from every source", rule(0, func(r *networkingv1.NetworkPolicyIngressRule) { r.From = nil }), "every source"},
		{"client port from every pod", rule(0, func(r *networkingv1.NetworkPolicyIngressRule) {
			r.From = append(r.From, networkingv1.NetworkPolicyPeer{PodSelector: &metav1.LabelSelector{}})
		}), "other than kvindex's"},
		{"relays cut off", rule(0, func(r *networkingv1.NetworkPolicyIngressRule) { r.From = r.From[:1] }), "relay's pods cannot reach"},
		{"monitor port open", rule(2, func(r *networkingv1.NetworkPolicyIngressRule) {
			r.Ports = append(r.Ports, r.Ports[0])
			r.Ports[1].Port.IntVal = 8222
		}), "port 8222"},
		{"routes closed", func(_ *values, s *streamSettings) { s.Policy.Spec.Ingress = slices.Delete(s.Policy.Spec.Ingress, 1, 2) }, "cluster port"},
		{"policy on other pods", func(_ *values, s *streamSettings) {
			s.Policy.Spec.PodSelector.MatchLabels = map[string]string{"app": "other"}
		}, "does not select the NATS pods"},
	}
	data := Values
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v, s := loadValues(t, data), loadStream(t)
			c.mutate(&v, &s)
			got := problems(v, s)
			if !slices.ContainsFunc(got, func(p string) bool { return strings.Contains(p, c.want) }) {
				t.Errorf("problems %q, want one mentioning %q", got, c.want)
			}
		})
	}
}

func TestWithin(t *testing.T) {
	for _, c := range []struct {
		p, e string
		want bool
	}{
		{"kvevents.>", "kvevents.>", true},
		{"kvevents.a.b", "kvevents.>", true},
		{"kvevents", "kvevents.>", false},
		{">", "kvevents.>", false},
		{"kvevents.*", "kvevents.>", true},
		{"$JS.API.>", "$JS.API.STREAM.INFO.KVEVENTS", false},
		{"$JS.API.STREAM.INFO.*", "$JS.API.STREAM.INFO.KVEVENTS", false},
		{"$JS.API.STREAM.INFO.KVEVENTS", "$JS.API.STREAM.INFO.KVEVENTS", true},
		{"$JS.API.STREAM.INFO.KVEVENTS.x", "$JS.API.STREAM.INFO.KVEVENTS", false},
		{"a.b", "a.*", true},
		{"a.*", "a.b", false},
	} {
		if got := within(c.p, c.e); got != c.want {
			t.Errorf("within(%q, %q) = %v, want %v", c.p, c.e, got, c.want)
		}
	}
}
