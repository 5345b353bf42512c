// Package nginx holds the NGINX example that routes OpenAI requests with
// kvindex picker (nginx.conf, pick.js; README.md explains them) and its
// end-to-end test: the kvindex binary's simulated engines, kvindex serve
// following them and kvindex picker, behind a real nginx from Debian's
// nginx and libnginx-mod-http-js packages running this directory's
// configuration. The package has no Go API.
package nginx
