package tokenizer

// GPT-2's byte-level alphabet: a reversible map from the 256 byte values to
// printable code points, so that a vocabulary of strings can spell any byte
// sequence. Printable Latin-1 bytes ('!'..'~', '¡'..'¬', '®'..'ÿ') map to
// themselves; the remaining 68 bytes (controls, space, DEL, NBSP, soft
// hyphen, ...) map, in byte order, to U+0100, U+0101, ...
//
// Vocabularies of byte-level BPE tokenizers (GPT-2, Llama 3, Qwen 2) store
// their tokens in this alphabet: "Ġthe" is " the", "Ċ" is "\n".

// byteRune[b] is the code point that spells byte b.
var byteRune [256]rune

// runeByte inverts byteRune: runeByte[r] is b+1 when byteRune[b] == r, and 0
// for code points outside the alphabet. The largest spelling is U+0143.
var runeByte [0x144]uint16

func init() {
	next := rune(0x100)
	for b := 0; b < 256; b++ {
		if ('!' <= b && b <= '~') || (0xA1 <= b && b <= 0xAC) || (0xAE <= b && b <= 0xFF) {
			byteRune[b] = rune(b)
		} else {
			byteRune[b] = next
			next++
		}
		runeByte[byteRune[b]] = uint16(b) + 1
	}
}

// byteLevelDecode converts a vocabulary string to the raw bytes it spells,
// appending to dst. ok is false when s holds a code point outside the
// alphabet (such a token cannot be produced from byte-level input).
func byteLevelDecode(dst []byte, s string) (_ []byte, ok bool) {
	for _, r := range s {
		if r < 0 || int(r) >= len(runeByte) || runeByte[r] == 0 {
			return dst, false
		}
		dst = append(dst, byte(runeByte[r]-1))
	}
	return dst, true
}
