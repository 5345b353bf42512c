// Routes each OpenAI request to the engine kvindex picker chooses.
//
// njs 0.7.x (Debian bookworm) runs js_set handlers synchronously, so a
// variable cannot wait for the picker's answer; a js_content handler can.
// It sends the request body to the picker through a subrequest (nginx does
// the HTTP, with the timeouts set on location /_pick), stores the chosen
// host:port in $kvindex_upstream (a js_var, which keeps its value across
// the redirect) and redirects internally to @engine, which proxies the
// original request, body and headers unchanged, to $kvindex_upstream.
// Any failure of the picker routes to the "engines" upstream group
// (round robin) instead: the picker speeds requests up, it never stops
// them.

function route(r) {
    r.subrequest('/_pick', { method: 'POST', body: r.requestText || '' })
        .then(function (reply) {
            var endpoint = null;
            if (reply.status === 200) {
                try {
                    endpoint = JSON.parse(reply.responseText).endpoint;
                } catch (e) {
                    r.warn('kvindex picker: unreadable answer: ' + e);
                }
            } else {
                r.warn('kvindex picker: status ' + reply.status + ', using the fallback');
            }
            // host:port only: the value becomes part of the proxy_pass URL.
            if (typeof endpoint === 'string' && /^[A-Za-z0-9.\-]+:[0-9]+$|^\[[0-9A-Fa-f:.]+\]:[0-9]+$/.test(endpoint)) {
                r.variables.kvindex_upstream = endpoint;
            } else {
                if (reply.status === 200) {
                    r.warn('kvindex picker: no usable endpoint in its answer, using the fallback');
                }
                r.variables.kvindex_upstream = 'engines';
            }
            r.internalRedirect('@engine');
        })
        .catch(function (e) {
            r.error('kvindex picker: subrequest failed: ' + e);
            r.variables.kvindex_upstream = 'engines';
            r.internalRedirect('@engine');
        });
}

export default { route };
