// Package wiretest provides the fixtures the tests of the client's and
// the server's hand-written codecs share.
//
// The client decodes what the server encodes; both sides test their half
// against protobuf-go with the same sample answer. Only tests import this
// package.
package wiretest
