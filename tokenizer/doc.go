// Package tokenizer turns the text of an inference request into the token
// ids the engine will see, so that kvindex can hash them into the engine's
// prefix-block keys.
//
// Ids the caller sends are always preferred: they are the only input with
// no ambiguity, and the API layer uses them as they are. This package is for
// requests that carry only text: a completion prompt (/v1/completions) or
// chat messages (/v1/chat/completions). Which form a request is in must
// come from the path it was sent to, because the two forms tokenize
// differently: the completion form adds the tokenizer's special tokens (BOS
// for Llama 3) by default, the chat form renders the model's chat template,
// which writes its own special tokens, and adds none.
//
// # Backends
//
// HTTP calls the engine's own POST /tokenize (vLLM's API; see NewHTTP).
// The engine applies the served model's tokenizer, special-token policy and
// chat template, so its ids are exact for both forms, chat templates, tool
// definitions and chat_template_kwargs included (pass those in
// Input.ChatParams, the fields of ChatFields; content parts and tool calls
// travel in Message.Raw). Everything the caller gives reaches the engine
// verbatim, since the template renders it into the prompt. Each call costs
// a round trip, so results are kept in an LRU cache bounded by entries and
// bytes, keyed by a 128-bit keyed hash of (model, form, add_special_tokens,
// content: the prompt, or every message whole and the chat parameters). Requests time out (5 s by
// default); responses are size-limited; errors name the URL, the HTTP status
// and the engine's own message.
//
// Local reads a HuggingFace tokenizer.json (plain or gzip-compressed) of a
// byte-level BPE model (GPT-2, Llama 3, Qwen 2/2.5/3 and other GPT-4-style
// vocabularies) and tokenizes in pure Go. It reproduces HuggingFace
// tokenizers' ids exactly, which is what vLLM uses for these models: added
// tokens are cut out first (leftmost-longest, with their lstrip, rstrip,
// single_word and normalized flags), then NFC/NFD/NFKC/NFKD normalisation,
// the Split regexes and the ByteLevel step (the GPT-2, cl100k, Qwen2 and
// o200k patterns by a one-pass scanner that FuzzPreTokenizeScanner holds to
// regexp2's matches, any other through regexp2, Oniguruma look-ahead
// included), then the BPE merges in merge-rank order, then the
// post-processor's special tokens (TemplateProcessing, Roberta, Bert) when
// add_special_tokens is set. The tests check every id of a few hundred
// varied texts (ASCII, code, CJK, emoji, combining marks, NBSP/ZWSP, digit
// and whitespace runs, chat special tokens, an 8k-token prompt) against
// HuggingFace tokenizers 0.23.2, on Qwen2.5's tokenizer.json and on six
// variants of it that switch on the features Qwen2.5 does not use itself.
//
// Local.WithSegmentCache adds a byte-bounded LRU of the ids of the text
// segments it encodes, for callers that tokenize the same text again and again with a
// little more each time (an agent conversation resent every turn, a prompt
// grown by appending). Tokenization never crosses an added token, so the
// text between two of them (one chat message) encodes alone and is cached
// under a keyed 128-bit hash of its normalised text. Long segments are also
// cut into chunks at positions where the pre-tokenizer provably splits the
// same way on the parts as on the whole: after a newline and before an
// ASCII letter or digit, for the GPT-2, cl100k (Llama 3), Qwen2 and o200k
// patterns only (segcache.go has the proof, FuzzSegmentCache and
// FuzzPreTokenizeChunks check it); other pre-tokenizers cache whole
// segments. Cuts depend only on the text before them, so a text that
// extends another re-encodes only its last chunk and what is new. The ids
// are those of encoding without the cache; Local.Stats counts hits and
// misses. ChatLocal inherits the cache of its Local; it still renders the
// whole conversation with the template each time.
//
// Fallback chains backends: typically the engine first, the local file
// when the engine is unreachable.
//
// CheckEngines compares a local tokenizer with the engines' /tokenize on
// built-in samples of each form (CheckSamples), so that a tokenizer.json
// or chat template that differs from what the engines run (a custom
// --chat-template on vLLM) is found at start rather than as prefixes that
// never match.
//
// All tokenizers also implement Appender, which appends to a caller's
// buffer instead of allocating the result.
//
// # Limits
//
// The local backend refuses, with ErrUnsupported and a message naming the
// feature, every tokenizer.json it cannot reproduce exactly: SentencePiece
// and Unigram models (Llama 2, Gemma, Mistral v1/v2), WordPiece, WordLevel,
// Metaspace pre-tokenizers, BPE dropout, subword prefixes and suffixes,
// normalizers other than the Unicode forms. On its own it renders no chat
// templates: the chat form returns ErrChatTemplate. ChatLocal pairs it with
// the model's chat template (package chattemplate, checked against
// HuggingFace's rendering) and then tokenizes the chat form too, except
// requests whose rendering vLLM shapes in ways it does not reproduce (a
// request's own chat_template, continue_final_message, content parts,
// multimodal settings): those return ErrChatUnsupported, so that a
// Fallback asks the engine. It reads tokenizer.json only: settings that some
// transformers tokenizer classes take from tokenizer_config.json (such as
// LlamaTokenizerFast's add_bos_token) are not applied, and neither are
// tokenizer.json's truncation and padding (which vLLM ignores too). The
// Unicode tables (letters, digits, whitespace, normalisation) are Go's,
// which can differ from the engine's for characters assigned in the newest
// Unicode versions. Invalid UTF-8 reads as one U+FFFD per bad byte, as it
// does when the text arrives in JSON. A Local serves one tokenizer and
// ignores the model name; route models to tokenizers in the caller.
//
// # Performance
//
// BenchmarkLocalTokenize (encoding an 8k-token prompt), BenchmarkLoad,
// BenchmarkHTTPCached, BenchmarkLocalHostile, BenchmarkChatTurn and
// BenchmarkGrowingPrompt (a 16k-token conversation or prompt growing by
// ~300 tokens, with and without the segment cache) and
// BenchmarkPreTokenizeScanner (the scanner against regexp2) measure this
// package;
// README.md's Performance section holds their figures. The merge loop is
// O(n log n) in the length of a pre-tokenized piece, so hostile input (one
// long whitespace run) costs time proportional to its size, not quadratic
// in it.
package tokenizer
