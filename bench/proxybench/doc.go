// Package proxybench is the logic of the proxybench command: the upstream, the client
// workloads, the proxies it starts (on loopback, and compass-proxy in a sandbox of
// network namespaces for its transparent and explicit paths), and the report.
// Method and results: docs/bench.md.
package proxybench
