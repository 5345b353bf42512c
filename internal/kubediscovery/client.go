package kubediscovery

import (
	"errors"
	"fmt"
	"os"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// NewClient returns a pods client (see PodClient) and its default namespace: the pod's own
// (service account) when running in a cluster and KUBECONFIG is not set,
// else the current context of the kubeconfig (KUBECONFIG, or
// ~/.kube/config). The error says why neither works.
func NewClient() (PodClient, string, error) {
	var inClusterErr error
	if os.Getenv("KUBECONFIG") == "" {
		cfg, err := rest.InClusterConfig()
		if err == nil {
			dc, err := dynamic.NewForConfig(cfg)
			if err != nil {
				return nil, "", fmt.Errorf("kubernetes in-cluster client: %w", err)
			}
			ns, err := inClusterNamespace()
			if err != nil {
				return nil, "", err
			}
			return DynamicPods(dc), ns, nil
		}
		inClusterErr = err
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{})
	cfg, err := cc.ClientConfig()
	if err != nil {
		if inClusterErr != nil && clientcmd.IsEmptyConfig(err) {
			return nil, "", fmt.Errorf("no Kubernetes API to ask: not in a cluster (%v) and no kubeconfig (set KUBECONFIG or write ~/.kube/config)", inClusterErr)
		}
		return nil, "", fmt.Errorf("kubeconfig: %w", err)
	}
	ns, _, err := cc.Namespace()
	if err != nil {
		return nil, "", fmt.Errorf("kubeconfig namespace: %w", err)
	}
	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, "", fmt.Errorf("kubeconfig client: %w", err)
	}
	return DynamicPods(dc), ns, nil
}

// namespaceFile is where the service account's namespace is mounted.
const namespaceFile = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

func inClusterNamespace() (string, error) {
	b, err := os.ReadFile(namespaceFile)
	if err != nil {
		return "", fmt.Errorf("kubernetes in-cluster namespace: %w", err)
	}
	if len(b) == 0 {
		return "", errors.New("kubernetes in-cluster namespace: " + namespaceFile + " is empty")
	}
	return string(b), nil
}
