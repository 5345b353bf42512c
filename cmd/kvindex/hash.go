package main

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/kvindex/kvindex/api/client"
	"github.com/kvindex/kvindex/blockhash"
	"github.com/kvindex/kvindex/internal/service"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// hashFlags select the engines' hashing scheme: --hash-algo, --hash-seed
// and --block-size on every command that hashes.
type hashFlags struct {
	algo      string
	seed      string
	blockSize int
}

func (f *hashFlags) register(fs *pflag.FlagSet) {
	names := make([]string, len(blockhash.Algos))
	for i, a := range blockhash.Algos {
		names[i] = string(a)
	}
	fs.StringVar(&f.algo, "hash-algo", string(blockhash.DefaultAlgo),
		"block hash algorithm, as the engines' --prefix-caching-hash-algo: "+strings.Join(names, "|")+" (vLLM's default is sha256)")
	fs.StringVar(&f.seed, "hash-seed", blockhash.DefaultSeed,
		"the engines' PYTHONHASHSEED; vLLM uses \""+blockhash.DefaultSeed+"\" when it is unset (older vLLM: random, which cannot be mirrored)")
	fs.IntVar(&f.blockSize, "block-size", blockhash.DefaultBlockSize, "tokens per KV-cache block, as the engines' --block-size")
}

func (f *hashFlags) hasher() (*blockhash.Hasher, error) {
	algo := blockhash.Algo(f.algo)
	known := false
	for _, a := range blockhash.Algos {
		known = known || a == algo
	}
	if !known {
		return nil, usagef("unknown --hash-algo %q (want one of %v)", f.algo, blockhash.Algos)
	}
	if f.blockSize < 1 || f.blockSize > blockhash.MaxBlockSize {
		return nil, usagef("--block-size %d out of range: want 1..%d", f.blockSize, blockhash.MaxBlockSize)
	}
	return blockhash.New(blockhash.Config{Algo: algo, Seed: f.seed, BlockSize: f.blockSize})
}

// extraFlags are the hash-affecting request inputs beyond tokens.
type extraFlags struct {
	lora     string
	salt     string
	mm       []string
	legacyMM bool
}

func (f *extraFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&f.lora, "lora-name", "", "LoRA adapter name of the request (part of every block's hash)")
	fs.StringVar(&f.salt, "cache-salt", "", "cache_salt of the request (part of the first block's hash)")
	fs.StringArrayVar(&f.mm, "mm", nil, "multimodal item ID:OFFSET:LENGTH (identifier, first placeholder token, token count); repeatable")
	fs.BoolVar(&f.legacyMM, "legacy-mm", false, "hash multimodal items the way vLLM before v0.18 did (bare identifier)")
}

func (f *extraFlags) extras() (*blockhash.Extras, error) {
	x := &blockhash.Extras{LoRAName: f.lora, CacheSalt: f.salt, LegacyMM: f.legacyMM}
	for _, s := range f.mm {
		item, err := blockhash.ParseMMItem(s)
		if err != nil {
			return nil, usagef("--mm %q: %v", s, err)
		}
		x.MM = append(x.MM, item)
	}
	if err := x.Validate(); err != nil {
		return nil, usagef("--mm: %v", err)
	}
	return x, nil
}

func newHashCmd() *cobra.Command {
	var (
		hf             hashFlags
		xf             extraFlags
		tf             tokenFlags
		tok            tokenizerFlags
		text, messages string
		asJSON         bool
	)
	cmd := &cobra.Command{
		Use:   "hash (--tokens 1,2,3 | --tokens-file FILE | --tokenizer F [--chat-template F] (--prompt TEXT | --messages-file F))",
		Short: "Compute the block hashes an engine reports for token ids or a prompt",
		Long: `hash prints, for each full block of the given token ids, the hash the engine
puts in its KV events, so a hash mismatch between kvindex and an engine can be
debugged by hand: compare with the block_hashes of a BlockStored event.

Plain output, one line per full block (a trailing partial block is not hashed):
  <index> <event int, unsigned decimal> <full digest, hex>
With --json:
  {"none_hash":"<hex>","blocks":[{"index":0,"hash":"<hex>","event_int":N}]}`,
		Example: `  kvindex hash --hash-algo sha256_cbor --hash-seed 0 --tokens $(seq -s, 0 47)
  kvindex hash --tokenizer tokenizer.json --chat-template tokenizer_config.json --messages-file chat.json
  kvindex hash --hash-algo sha256 --hash-seed 42 --lora-name sql-lora --tokens-file prompt.json --json`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			h, err := hf.hasher()
			if err != nil {
				return err
			}
			x, err := xf.extras()
			if err != nil {
				return err
			}
			var toks []uint64
			if text != "" || messages != "" {
				toks, err = tokenizePrompt(cmd, tok, tf, text, messages)
			} else {
				toks, err = tf.load(cmd.InOrStdin())
			}
			if err != nil {
				return err
			}
			if bs := h.BlockSize(); len(toks) < bs {
				return fmt.Errorf("%s less than one block of %d: engines hash only full blocks", countTokens(len(toks)), bs)
			}
			hashes, err := h.Chain(nil, nil, 0, toks, x)
			if err != nil {
				return err
			}
			return printHashes(cmd, h, hashes, asJSON)
		},
	}
	hf.register(cmd.Flags())
	xf.register(cmd.Flags())
	tf.register(cmd.Flags())
	tok.register(cmd.Flags())
	cmd.Flags().StringVar(&text, "prompt", "", "prompt text, tokenized by --tokenizer (completion form)")
	cmd.Flags().StringVar(&messages, "messages-file", "", "chat messages, rendered by --chat-template and tokenized by --tokenizer: a JSON array of OpenAI messages, or a chat request object; - reads stdin")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON instead of lines")
	return cmd
}

// tokenizePrompt tokenizes --prompt or --messages-file with the local
// tokenizer, as kvindex serve and kvindex picker do.
func tokenizePrompt(cmd *cobra.Command, tok tokenizerFlags, tf tokenFlags, text, messages string) ([]uint64, error) {
	switch {
	case tf.set() || text != "" && messages != "":
		return nil, usagef("give one of --tokens/--tokens-file, --prompt and --messages-file")
	case tok.file == "":
		return nil, usagef("--prompt and --messages-file need --tokenizer (and chat messages --chat-template)")
	}
	p := client.TextPrompt(text)
	if messages != "" {
		var err error
		if p, err = readMessagesFile(messages, cmd.InOrStdin()); err != nil {
			return nil, err
		}
	}
	ids, err := service.TokenizeLocally(cmd.Context(), tok.file, tok.chatTemplate, p)
	return ids, configUsage(err, serveFlagNames)
}

// countTokens says "1 token is" or "N tokens are".
func countTokens(n int) string {
	if n == 1 {
		return "1 token is"
	}
	return strconv.Itoa(n) + " tokens are"
}

func printHashes(cmd *cobra.Command, h *blockhash.Hasher, hashes []blockhash.Hash, asJSON bool) error {
	w := cmd.OutOrStdout()
	if !asJSON {
		for i, hh := range hashes {
			if _, err := fmt.Fprintf(w, "%d %d %s\n", i, hh.Key, hh.Hex()); err != nil {
				return err
			}
		}
		return nil
	}
	type block struct {
		Index    int    `json:"index"`
		Hash     string `json:"hash"`
		EventInt uint64 `json:"event_int"`
	}
	out := struct {
		NoneHash string  `json:"none_hash"`
		Blocks   []block `json:"blocks"`
	}{NoneHash: h.NoneHash().Hex(), Blocks: make([]block, len(hashes))}
	for i, hh := range hashes {
		out.Blocks[i] = block{Index: i, Hash: hh.Hex(), EventInt: hh.Key}
	}
	enc := json.NewEncoder(w)
	return enc.Encode(out)
}
