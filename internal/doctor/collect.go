package doctor

import (
	"context"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/api/kvindexv1"
)

// Collect asks the kvindex c is connected to what Build needs: its
// engines, its hashing, and, when an engine is flagged mismatch, the
// engines' kept events (refused without the admin scope, which Build then
// reports). seeds and only become Input.Seeds and Input.Only. An error is
// an RPC failure.
func Collect(ctx context.Context, c *client.Client, seeds, only []string) (Input, error) {
	in := Input{Server: c.Addr(), Seeds: seeds, Only: only}
	var err error
	if in.Pods, err = c.Pods(ctx, ""); err != nil {
		return in, err
	}
	in.Now = time.Now()
	in.Hash, err = c.Index.GetHashConfig(ctx, &kvindexv1.GetHashConfigRequest{})
	if status.Code(err) == codes.Unimplemented {
		in.Hash, err = nil, nil
	}
	if err != nil {
		return in, err
	}
	mismatch := false
	for _, p := range in.Pods.GetPods() {
		mismatch = mismatch || p.GetHashCheck() == kvindexv1.HashCheck_HASH_CHECK_MISMATCH
	}
	if !mismatch {
		return in, nil
	}
	in.Samples, err = c.HashSamples(ctx, "", only)
	switch status.Code(err) {
	case codes.OK:
	case codes.PermissionDenied, codes.Unauthenticated:
		in.SamplesErr = "reading the engines' events needs a credential with the admin scope (" + status.Convert(err).Message() + ")"
	case codes.Unimplemented:
		in.SamplesErr = "this kvindex does not keep the engines' events (an older version)"
	default:
		return in, err
	}
	return in, nil
}
