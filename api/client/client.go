package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/experimental"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/kvindex/kvindex/api/indexerv1"
	"github.com/kvindex/kvindex/api/internal/wire"
	"github.com/kvindex/kvindex/api/kvindexv1"
)

// DefaultPort is the port a kvindex serves gRPC on by default, which
// ParseTarget adds to a bare host.
const DefaultPort = "50051"

// DefaultAddr is where a kvindex serves gRPC by default.
const DefaultAddr = "localhost:" + DefaultPort

// clientMaxMsgSize bounds the messages a Client sends and receives:
// 64 MiB holds a Lookup of the longest prompt.
const clientMaxMsgSize = 64 << 20

// Client is a kvindex gRPC client. Its typed helpers cover the common
// calls; Index and Indexer expose the raw generated clients.
type Client struct {
	conn *grpc.ClientConn
	addr string

	// Index is the kvindex.v1 API.
	Index kvindexv1.IndexServiceClient
	// Indexer is llm-d's indexer.v1 API.
	Indexer indexerv1.IndexerServiceClient
}

// Dial connects to the kvindex at addr ("host:port") and checks that it
// answers, within ctx. The connection is plaintext unless opts say
// otherwise; opts are applied after the defaults. A kvindex that cannot be
// reached gives an error reading "cannot reach kvindex at ADDR: ...".
func Dial(ctx context.Context, addr string, opts ...grpc.DialOption) (*Client, error) {
	c, err := New(addr, opts...)
	if err != nil {
		return nil, err
	}
	// The health service answers before the server is ready, so this
	// checks reachability, not readiness.
	_, err = healthpb.NewHealthClient(c.conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil && status.Code(err) != codes.Unimplemented {
		c.conn.Close()
		return nil, fmt.Errorf("cannot reach kvindex at %s: %s", addr, dialMessage(err))
	}
	return c, nil
}

// New is Dial without the check: the client is built whether or not
// kvindex answers (it connects on the first call, or Conn().Connect), for
// a caller that must start before kvindex does, such as the picker
// beside its gateway. It fails only on a bad address or options.
func New(addr string, opts ...grpc.DialOption) (*Client, error) {
	base := []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(clientMaxMsgSize), grpc.MaxCallSendMsgSize(clientMaxMsgSize),
			grpc.ForceCodecV2(codec{})),
		experimental.WithBufferPool(wire.Buffers), // see wire.BufferPool
		grpc.WithInitialWindowSize(wire.WindowSize),
		grpc.WithInitialConnWindowSize(wire.ConnWindowSize),
		grpc.WithReadBufferSize(wire.IOBufferSize),
		grpc.WithWriteBufferSize(wire.IOBufferSize),
	}
	conn, err := grpc.NewClient(addr, append(base, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("cannot reach kvindex at %s: %w", addr, err)
	}
	return &Client{
		conn:    conn,
		addr:    addr,
		Index:   kvindexv1.NewIndexServiceClient(conn),
		Indexer: indexerv1.NewIndexerServiceClient(conn),
	}, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Conn is the underlying connection.
func (c *Client) Conn() *grpc.ClientConn { return c.conn }

// Addr is the address the client dialed.
func (c *Client) Addr() string { return c.addr }

// Ready reports whether the server is ready (every engine connected, or
// its grace period over), from the standard health service.
func (c *Client) Ready(ctx context.Context) (bool, error) {
	r, err := healthpb.NewHealthClient(c.conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return false, err
	}
	return r.GetStatus() == healthpb.HealthCheckResponse_SERVING, nil
}

// QueryOptions are the optional inputs of a query. LoRAName, CacheSalt
// and MMItems fill the prompt's fields of the same name where the prompt
// leaves them empty: a prompt field that is set is never replaced, and a
// query whose options and prompt set one field to different values fails
// (InvalidArgument) without being sent.
type QueryOptions struct {
	LoRAName  string
	CacheSalt string
	// MMItems are the multimodal inputs, sorted by offset.
	MMItems []*kvindexv1.MultimodalItem
	// Candidates restricts a LongestPrefix answer to these pods.
	Candidates []string
}

// TokensPrompt is a prompt given by its token ids.
func TokensPrompt(ids []uint64) *kvindexv1.Prompt {
	return &kvindexv1.Prompt{Input: &kvindexv1.Prompt_Tokens{Tokens: &kvindexv1.TokenIds{Ids: ids}}}
}

// TextPrompt is a completion prompt, tokenized by the server.
func TextPrompt(text string) *kvindexv1.Prompt {
	return &kvindexv1.Prompt{Input: &kvindexv1.Prompt_Text{Text: text}}
}

// MessagesPrompt is a chat conversation, rendered and tokenized by the
// server (which needs the engine's /tokenize for that). The messages are
// the API's own kvindexv1.ChatMessage: the client has no chat-message type
// of its own (the server turns them into tokenizer.Message, which the
// client cannot import).
func MessagesPrompt(msgs ...*kvindexv1.ChatMessage) *kvindexv1.Prompt {
	return &kvindexv1.Prompt{Input: &kvindexv1.Prompt_Messages{Messages: &kvindexv1.ChatMessages{Messages: msgs}}}
}

// ChatPrompt is a chat conversation with the request fields that change
// how the engine renders it, paramsJSON: a JSON object such as
// {"tools":[...],"chat_template_kwargs":{"enable_thinking":false}}, or ""
// for none (kvindexv1.ChatMessages.chat_params_json lists the fields).
// Pass the values as the chat request has them: the template renders them
// into the prompt, key order included.
func ChatPrompt(paramsJSON string, msgs ...*kvindexv1.ChatMessage) *kvindexv1.Prompt {
	p := MessagesPrompt(msgs...)
	p.GetMessages().ChatParamsJson = paramsJSON
	return p
}

// MessageJSON is a chat message given whole as its OpenAI JSON object, for
// what a role and a text content cannot carry: content parts, tool calls,
// tool results, names. The server sends it to the engine verbatim.
func MessageJSON(obj string) *kvindexv1.ChatMessage {
	return &kvindexv1.ChatMessage{MessageJson: obj}
}

// HashesPrompt is a prompt given by precomputed block hashes.
func HashesPrompt(hashes []uint64) *kvindexv1.Prompt {
	return &kvindexv1.Prompt{Input: &kvindexv1.Prompt_BlockHashes{BlockHashes: &kvindexv1.BlockHashes{Hashes: hashes}}}
}

// withOptions returns p with o's prompt fields filled in where p leaves
// them empty (see QueryOptions). p itself is never changed, as callers
// may share it: when o adds anything, the result is a shallow copy of p
// made field by field through protobuf reflection, so that it keeps every
// field p has, those this code does not name included.
func withOptions(p *kvindexv1.Prompt, o *QueryOptions) (*kvindexv1.Prompt, error) {
	if o == nil || p == nil {
		return p, nil
	}
	lora, err := fillString("lora_name", p.GetLoraName(), o.LoRAName, "LoRAName")
	if err != nil {
		return nil, err
	}
	salt, err := fillString("cache_salt", p.GetCacheSalt(), o.CacheSalt, "CacheSalt")
	if err != nil {
		return nil, err
	}
	mm := p.GetMmItems()
	switch {
	case len(o.MMItems) == 0:
	case len(mm) == 0:
		mm = o.MMItems
	case !slices.EqualFunc(mm, o.MMItems, func(a, b *kvindexv1.MultimodalItem) bool { return proto.Equal(a, b) }):
		return nil, status.Error(codes.InvalidArgument, "the prompt's mm_items differ from QueryOptions.MMItems; give them in one place")
	}
	if lora == p.GetLoraName() && salt == p.GetCacheSalt() && len(mm) == len(p.GetMmItems()) {
		return p, nil
	}
	q := &kvindexv1.Prompt{}
	src, dst := p.ProtoReflect(), q.ProtoReflect()
	src.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		dst.Set(fd, v) // messages and lists are shared, not copied
		return true
	})
	dst.SetUnknown(src.GetUnknown())
	q.LoraName, q.CacheSalt, q.MmItems = lora, salt, mm
	return q, nil
}

// fillString is the value of a prompt field given in the prompt (has)
// and in the options (opt): one of them, or an error if both are set and
// differ.
func fillString(field, has, opt, option string) (string, error) {
	switch {
	case opt == "" || opt == has:
		return has, nil
	case has == "":
		return opt, nil
	}
	return "", status.Errorf(codes.InvalidArgument, "the prompt's %s %q differs from QueryOptions.%s %q; give it in one place", field, has, option, opt)
}

func candidates(o *QueryOptions) []string {
	if o == nil {
		return nil
	}
	return o.Candidates
}

// LongestPrefix asks which engines hold the prompt's leading blocks; o
// may be nil.
func (c *Client) LongestPrefix(ctx context.Context, model string, p *kvindexv1.Prompt, o *QueryOptions) (*kvindexv1.LongestPrefixResponse, error) {
	p, err := withOptions(p, o)
	if err != nil {
		return nil, err
	}
	return c.Index.LongestPrefix(ctx, &kvindexv1.LongestPrefixRequest{
		Model: model, Prompt: p, CandidatePods: candidates(o),
	})
}

// LongestPrefixTokens is LongestPrefix for token ids.
func (c *Client) LongestPrefixTokens(ctx context.Context, model string, ids []uint64, o *QueryOptions) (*kvindexv1.LongestPrefixResponse, error) {
	return c.LongestPrefix(ctx, model, TokensPrompt(ids), o)
}

// LongestPrefixText is LongestPrefix for a completion prompt.
func (c *Client) LongestPrefixText(ctx context.Context, model, text string, o *QueryOptions) (*kvindexv1.LongestPrefixResponse, error) {
	return c.LongestPrefix(ctx, model, TextPrompt(text), o)
}

// LongestPrefixMessages is LongestPrefix for a chat conversation.
func (c *Client) LongestPrefixMessages(ctx context.Context, model string, msgs []*kvindexv1.ChatMessage, o *QueryOptions) (*kvindexv1.LongestPrefixResponse, error) {
	return c.LongestPrefix(ctx, model, MessagesPrompt(msgs...), o)
}

// LongestPrefixHashes is LongestPrefix for precomputed block hashes.
func (c *Client) LongestPrefixHashes(ctx context.Context, model string, hashes []uint64, candidatePods []string) (*kvindexv1.LongestPrefixResponse, error) {
	return c.LongestPrefix(ctx, model, HashesPrompt(hashes), &QueryOptions{Candidates: candidatePods})
}

// Lookup returns every block of the prompt with its holders; o may be
// nil (its Candidates are ignored).
func (c *Client) Lookup(ctx context.Context, model string, p *kvindexv1.Prompt, o *QueryOptions) (*kvindexv1.LookupResponse, error) {
	p, err := withOptions(p, o)
	if err != nil {
		return nil, err
	}
	return c.Index.Lookup(ctx, &kvindexv1.LookupRequest{Model: model, Prompt: p})
}

// LookupTokens is Lookup for token ids.
func (c *Client) LookupTokens(ctx context.Context, model string, ids []uint64, o *QueryOptions) (*kvindexv1.LookupResponse, error) {
	return c.Lookup(ctx, model, TokensPrompt(ids), o)
}

// ListPods returns the engines the server follows ("" model: all).
func (c *Client) ListPods(ctx context.Context, model string) ([]*kvindexv1.PodInfo, error) {
	r, err := c.Pods(ctx, model)
	return r.GetPods(), err
}

// Pods is ListPods' whole answer: the engines, the fleet's cached-prefix
// fraction when the server scrapes the engines, and the index sequence
// the answer reflects (index_seq).
func (c *Client) Pods(ctx context.Context, model string) (*kvindexv1.ListPodsResponse, error) {
	return c.Index.ListPods(ctx, &kvindexv1.ListPodsRequest{Model: model})
}

// HashSamples returns the BlockStored events the server keeps of each
// engine whose hashes it could not reproduce ("" model: every model; no
// pods: every pod), for a search of the engine's hashing configuration
// (kvindex doctor). It needs a credential with the admin scope.
func (c *Client) HashSamples(ctx context.Context, model string, pods []string) (*kvindexv1.HashSamplesResponse, error) {
	return c.Index.HashSamples(ctx, &kvindexv1.HashSamplesRequest{Model: model, Pods: pods})
}

// PodNames returns the names of the pods the server follows engines of
// ("" model: all), sorted, each once however many data-parallel ranks
// and models it has.
func (c *Client) PodNames(ctx context.Context, model string) ([]string, error) {
	pods, err := c.ListPods(ctx, model)
	if err != nil {
		return nil, err
	}
	names := make([]string, len(pods))
	for i, p := range pods {
		names[i] = p.GetPod()
	}
	slices.Sort(names)
	return slices.Compact(names), nil
}

// PodScores is llm-d's GetPodScores: each pod's count of leading blocks
// of the tokenized prompt.
func (c *Client) PodScores(ctx context.Context, model, prompt string, pods []string) ([]*indexerv1.PodScore, error) {
	r, err := c.Indexer.GetPodScores(ctx, &indexerv1.GetPodScoresRequest{Prompt: prompt, ModelName: model, PodIdentifiers: pods})
	return r.GetScores(), err
}

// Watch streams the events the server applies (of the given pods; all if
// none) to fn until ctx is done (nil), the server ends the stream (nil),
// fn returns an error (that error) or the stream fails. A stream that fell
// behind fails with ResourceExhausted ("watch fell behind by N events;
// reconnect"): the events it missed are gone, so a caller that mirrors
// state resynchronises, then watches again.
func (c *Client) Watch(ctx context.Context, pods []string, fn func(*kvindexv1.WatchResponse) error) error {
	stream, err := c.Index.Watch(ctx, &kvindexv1.WatchRequest{Pods: pods})
	if err != nil {
		return err
	}
	for {
		ev, err := stream.Recv()
		switch {
		case err == nil:
		case errors.Is(err, io.EOF):
			return nil
		case ctx.Err() != nil && status.Code(err) == codes.Canceled:
			return nil
		default:
			return err
		}
		if err := fn(ev); err != nil {
			return err
		}
	}
}

// dialMessage shortens gRPC's connection errors to their cause
// ("dial tcp 127.0.0.1:50051: connect: connection refused").
func dialMessage(err error) string {
	msg := status.Convert(err).Message()
	if _, after, ok := strings.Cut(msg, "Error while dialing: "); ok {
		msg = strings.TrimSuffix(after, `"`)
	}
	return msg
}
