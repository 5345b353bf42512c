// gen_golden.mjs writes golden.json: chat prompts rendered by
// @huggingface/jinja, the Jinja engine behind transformers.js's
// apply_chat_template, which chattemplate's tests compare the Go renderer
// against byte for byte.
//
// To rerun (Node >= 18; the packages are installed outside the repository):
//
//	mkdir -p /tmp/chatgen && cd /tmp/chatgen && npm init -y >/dev/null &&
//	  npm install @huggingface/jinja@0.5.13
//	NODE_PATH=/tmp/chatgen/node_modules node tokenizer/chattemplate/testdata/gen_golden.mjs
//
// (ES modules ignore NODE_PATH, so the script resolves the package through
// createRequire from NODE_PATH's first entry.)
//
// The templates are read from templates/ next to this script (see
// templates/NOTICE for where each comes from and its licence). Each case is
// rendered with the variables Python transformers' apply_chat_template
// passes, as vLLM calls it: messages, tools (null when the request has
// none), add_generation_prompt, the special tokens of the template's
// tokenizer_config.json.
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const base = (process.env.NODE_PATH || '').split(path.delimiter)[0] || process.cwd();
const require = createRequire(path.join(base, 'noop.js'));
const { Template } = require('@huggingface/jinja');
const jinjaVersion = JSON.parse(fs.readFileSync(path.join(base, '@huggingface/jinja/package.json'), 'utf8')).version;

// Special tokens a .jinja file does not carry: the values of the model's
// tokenizer_config.json, which the Go test passes the same way.
const jinjaTokens = {
	'phi-3.5-mini.jinja': { bos_token: '<s>', eos_token: '<|endoftext|>', unk_token: '<unk>', pad_token: '<|endoftext|>' },
	'mistral-nemo.jinja': { bos_token: '<s>', eos_token: '</s>', unk_token: '<unk>' },
};

function loadTemplate(file) {
	const src = fs.readFileSync(path.join(here, 'templates', file), 'utf8');
	if (file.endsWith('.jinja')) {
		return { source: src, tokens: jinjaTokens[file] };
	}
	const cfg = JSON.parse(src);
	let t = cfg.chat_template;
	if (Array.isArray(t)) {
		t = t.find((x) => x.name === 'default').template;
	}
	const tokens = {};
	for (const k of ['bos_token', 'eos_token', 'unk_token', 'sep_token', 'pad_token', 'cls_token', 'mask_token']) {
		const v = cfg[k];
		if (v != null) {
			tokens[k] = typeof v === 'string' ? v : v.content;
		}
	}
	return { source: t, tokens };
}

const system = { role: 'system', content: 'You are a careful assistant. Answer in "plain" text — no emoji, ünïcödé is fine.' };
const multi = [
	{ role: 'user', content: 'Hello! What is 2+2?' },
	{ role: 'assistant', content: '2+2 is 4.' },
	{ role: 'user', content: 'And {{ 3*3 }} in Jinja?\nTwo lines,\ttabbed.' },
];
const tools = [
	{
		type: 'function',
		function: {
			name: 'get_weather',
			description: 'Get the current weather for a city, in °C or °F ("metric" by default).',
			parameters: {
				type: 'object',
				properties: {
					city: { type: 'string', description: 'City name, e.g. Zürich' },
					unit: { type: 'string', enum: ['celsius', 'fahrenheit'] },
					days: { type: 'integer', description: 'Forecast days' },
				},
				required: ['city'],
			},
		},
	},
	{
		type: 'function',
		function: {
			name: 'search',
			description: 'Search the web: <b>bold</b> & \u2028 \u0007 \\ \/ done.',
			parameters: { type: 'object', properties: { q: { type: 'string' } }, required: ['q'] },
		},
	},
];
const callArgs = { city: 'Zürich', unit: 'celsius' };
function toolTurn(argsAsString, callContent) {
	return [
		{ role: 'user', content: 'What is the weather in Zürich?' },
		{
			role: 'assistant',
			content: callContent,
			tool_calls: [{
				id: 'a1B2c3D4e',
				type: 'function',
				function: { name: 'get_weather', arguments: argsAsString ? JSON.stringify(callArgs) : callArgs },
			}],
		},
		{ role: 'tool', tool_call_id: 'a1B2c3D4e', name: 'get_weather', content: '{"temp": 21, "sky": "clear"}' },
	];
}

// Per template: which of the optional cases its template supports, and in
// which form it expects a tool call's arguments (a JSON object, as vLLM
// passes them, or the string DeepSeek-V3's template concatenates), and the
// content of an assistant message that only calls tools (null, as OpenAI
// clients send it; Qwen3's template concatenates it, so it gets "").
const templates = [
	{ file: 'qwen2.5.json', tools: true, toolCalls: true, argsString: false },
	{ file: 'qwen3.json', tools: true, toolCalls: true, argsString: false, parts: true, callContent: '' },
	{ file: 'deepseek-v3.json', tools: false, toolCalls: true, argsString: true },
	{ file: 'phi-3.5-mini.jinja' },
	{ file: 'mistral-nemo.jinja', tools: true, toolCalls: true, argsString: false, alternates: true },
];

function casesFor(t) {
	const cs = [
		{ name: 'system_multi_turn_gen', messages: [system, ...multi], add_generation_prompt: true },
		{ name: 'system_multi_turn_nogen', messages: [system, ...multi], add_generation_prompt: false },
		{ name: 'no_system_gen', messages: [multi[0]], add_generation_prompt: true },
		{ name: 'ends_with_assistant_nogen', messages: multi.slice(0, 2), add_generation_prompt: false },
	];
	cs.push({
		name: 'reasoning_in_history',
		messages: [multi[0], { role: 'assistant', content: '<think>\nTwo plus two.\n</think>\n\n2+2 is 4.' }, multi[2]],
		add_generation_prompt: true,
	});
	if (t.parts) {
		cs.push({
			name: 'content_parts',
			messages: [{ role: 'user', content: [{ type: 'text', text: 'Part one. ' }, { type: 'text', text: 'Part two.' }] }],
			add_generation_prompt: true,
		});
	}
	if (t.tools) {
		cs.push({ name: 'tools_gen', messages: [system, multi[0]], tools, add_generation_prompt: true });
		cs.push({ name: 'tools_no_system_gen', messages: [multi[0]], tools, add_generation_prompt: true });
	}
	if (t.toolCalls) {
		cs.push({ name: 'tool_call_and_result', messages: [system, ...toolTurn(t.argsString, t.callContent ?? null)], tools: t.tools ? tools : null, add_generation_prompt: true });
	}
	if (t.alternates) {
		cs.push({ name: 'roles_not_alternating', messages: [multi[0], multi[0]], add_generation_prompt: true });
	}
	return cs;
}

const out = { generator: 'tokenizer/chattemplate/testdata/gen_golden.mjs', engine: `@huggingface/jinja@${jinjaVersion}`, cases: [] };
for (const t of templates) {
	const { source, tokens } = loadTemplate(t.file);
	const tmpl = new Template(source);
	for (const c of casesFor(t)) {
		const vars = {
			...tokens,
			messages: c.messages,
			tools: c.tools ?? null,
			add_generation_prompt: c.add_generation_prompt,
		};
		const rec = { template: t.file, name: c.name, messages: c.messages, tools: c.tools ?? null, add_generation_prompt: c.add_generation_prompt };
		try {
			rec.output = tmpl.render(vars);
		} catch (e) {
			rec.error = String(e.message);
		}
		out.cases.push(rec);
	}
}
fs.writeFileSync(path.join(here, 'golden.json'), JSON.stringify(out, null, '\t') + '\n');
console.log(`golden.json: ${out.cases.length} cases`);
