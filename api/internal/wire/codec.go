package wire

import (
	"errors"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// CodecName is the name both sides' codecs register under: they replace
// gRPC's protobuf codec, so they speak "proto".
const CodecName = "proto"

var protoCodec = encoding.GetCodecV2(CodecName)

// Marshal is gRPC's protobuf encoding with the buffer taken from Buffers
// (unless the message is too small for pooling to pay). Each side's codec
// falls back to it for the messages it does not encode by hand.
func Marshal(v any) (mem.BufferSlice, error) {
	m, ok := v.(proto.Message)
	if !ok {
		return protoCodec.Marshal(v)
	}
	size := proto.Size(m)
	if mem.IsBelowBufferPoolingThreshold(size) {
		b, err := proto.MarshalOptions{UseCachedSize: true}.Marshal(m)
		if err != nil {
			return nil, err
		}
		return mem.BufferSlice{mem.SliceBuffer(b)}, nil
	}
	buf := Buffers.Get(size)
	b, err := proto.MarshalOptions{UseCachedSize: true}.MarshalAppend((*buf)[:0], m)
	if err != nil {
		Buffers.Put(buf)
		return nil, err
	}
	*buf = b
	return mem.BufferSlice{mem.NewBuffer(buf, Buffers)}, nil
}

// Unmarshal is gRPC's protobuf decoding without a copy when the message
// arrived in one piece. Each side's codec falls back to it for the
// messages it does not decode by hand.
func Unmarshal(data mem.BufferSlice, v any) error {
	m, ok := v.(proto.Message)
	if !ok {
		return protoCodec.Unmarshal(data, v)
	}
	return WithBytes(data, func(b []byte) error { return proto.Unmarshal(b, m) })
}

// WithBytes calls f with data's bytes in one slice, copying only when
// data is in several pieces.
func WithBytes(data mem.BufferSlice, f func([]byte) error) error {
	if len(data) == 1 {
		return f(data[0].ReadOnlyData())
	}
	buf := data.MaterializeToBuffer(Buffers)
	defer buf.Free()
	return f(buf.ReadOnlyData())
}

// The errors of the hand-written decoders, worded as protobuf-go words
// its own.
var (
	ErrInvalid = errors.New("proto: cannot parse invalid wire-format data")
	ErrUTF8    = errors.New("proto: string field contains invalid UTF-8")
)

// ConsumeTag is protowire.ConsumeTag with the field-number bound the
// standard decoder enforces.
func ConsumeTag(b []byte) (protowire.Number, protowire.Type, int) {
	num, typ, n := protowire.ConsumeTag(b)
	if n >= 0 && num > protowire.MaxValidNumber {
		return 0, 0, -1
	}
	return num, typ, n
}
