// Package policy is the network policy language shared by every part of compass-egress
// (docs/policy.md): parsing and validation of the wire format, the canonical form, the
// compiled matcher, plan resolution, provider capabilities and the restriction
// statement.
//
// # Documents
//
// Policies, tasks, recipes and env params are JSON or YAML documents (DecodeDocument),
// some of them from outside the process: the proxy's admin API takes bodies of up to
// 32 MiB. A document whose lists and objects nest more than 32 levels deep is refused
// while it is decoded ("nesting deeper than 32 levels", with the byte offset in JSON or
// the line in YAML); the deepest real document, a task list, needs 6. YAML aliases are
// refused, so an alias bomb is never expanded, and yaml.v3 refuses more than 10000
// levels before the tree is built.
//
// Error messages are bounded whatever the input. A message shows at most 80 bytes of an
// offending list or object, and writes no more than that of it; every other fragment of
// user text in it (a string value, an object key in a path, a part of a target in the
// rule, a policy's wire form) at most 300 bytes, cut as "…(N more bytes)". The longest
// valid fragment, a wildcard host name with a port, is 261 bytes, so a valid value always
// shows whole. Cuts fall on character boundaries, so a message is valid UTF-8. All the
// problems of one input are reported together, but at most 100 of them, in input order,
// and then one line "and N more errors" (PlanAll: "and N more tasks cannot be planned").
//
// # Matching
//
// Compile turns a policy into a Matcher whose Decide cost does not grow with the number
// of rules. Exact names sit in an open-addressing hash table whose slots hold the name
// (sharing the policy's bytes), a hash tag and a rule reference; wildcard suffixes sit
// in a second table, looked up once per label of the requested name (and only for
// label counts that some wildcard has). A small Bloom filter in front of each table
// (16 to 32 bits per name, so it stays in the cache) turns most absent names away
// before they cost a read of the table's slots in main memory.
// Each address family is cut into disjoint spans at every prefix boundary; a radix index
// on the bits where the boundaries differ finds the span, which names its innermost
// prefix, and parent links lead outwards to the enclosing prefixes for the port check.
// Rules of one name or prefix that differ by port are grouped and ordered by port. The
// linear implementation that the compiled one replaced is kept in the tests as the
// reference: table tests, a property test and FuzzDecide compare the two decision for
// decision, the rule reported included.
//
// # Performance
//
// Measured with
//
//	go test -run '^$' -bench BenchmarkDecide -benchmem -count 3 ./policy/
//
// (make bench runs it once) on the project's 2-vCPU Intel Xeon virtual machine with
// nothing else running (load average 0.4-0.7 during the run), Go 1.26, best of 3. The
// policy is an allowlist of mixed rules: 30% exact hosts, 15% wildcards, 30% IPv4 and
// 25% IPv6 (each half addresses, half CIDRs), a fifth with a port; the benchmark decides
// 4096 destinations in turn, 80% of them hitting a rule of one kind or another.
// cpu-ns/op is the process's CPU time per decision. "matcher B/rule" is the compiled
// structures' heap after GC; the policy itself takes another 66-72 B/rule (at 1M rules
// the two together are 132 B/rule). The linear reference ran in the same run.
//
//	rules  ns/op  cpu-ns/op  allocs/op  compile (wall / CPU)  matcher B/rule  linear ns/op
//	10        32         32          0     0.05 / 0.05 ms               145  64 (2.0x)
//	1k        43         43          0     0.17 / 0.19 ms                72  5092 (120x)
//	100k      65         65          0       19 / 21 ms                  51  -
//	1M       117        118          0      249 / 283 ms                 65  -
//
// The 1M case is sensitive to what else runs on the machine: on the same machine shared
// with other jobs (load average 1-5) it measured between 180 and 400 ns per decision.
// At a million rules the policy and the index (about 130 MB) exceed the per-core caches
// and the TLB's reach: a decision costs two or three dependent reads of memory (name
// slot, then the name's bytes and the rule; or index, span and rule), served by the
// shared last-level cache when it is not being taken by neighbours, which is where the
// time goes. The name filters spare the slot read of a name no rule has.
package policy
