// Package policy is the network policy language shared by every part of compass-egress
// (SPEC §2–§6): parsing and validation of the wire format, the canonical form, the
// compiled matcher, plan resolution, provider capabilities and the restriction
// statement.
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
// (make bench runs it once) on a 2-vCPU Intel Xeon virtual machine shared with other
// jobs (load average 1.0-2.7 during the run), Go 1.26, best of 3. The policy is an
// allowlist of mixed rules: 30% exact hosts, 15% wildcards, 30% IPv4 and 25% IPv6
// (each half addresses, half CIDRs), a fifth with a port; the benchmark decides 4096
// destinations in turn, 80% of them hitting a rule of one kind or another. cpu-ns/op
// is the process's CPU time per decision. "matcher B/rule" is the compiled structures'
// heap after GC; the policy itself takes another 66 B/rule. The linear reference ran
// in the same run.
//
//	rules  ns/op  cpu-ns/op  allocs/op  compile (wall / CPU)  matcher B/rule  linear ns/op
//	10        63         63          0     0.07 / 0.07 ms               145  113 (1.8x)
//	1k        86         87          0     0.44 / 0.45 ms                72  10898 (127x)
//	100k     134        135          0       32 / 36 ms                  51  -
//	1M       259        261          0      394 / 451 ms                 65  -
//
// Other runs during the session measured the 1M case between about 180 and 400 ns per
// decision as the machine's neighbours came and went, too wide a spread to compare two
// revisions by. Compared instead by the fastest of 300 intervals of 16384 decisions at
// 1M rules, alternating the two builds 25 times, the name filters took the median of
// those minima from 204 to 186 ns.
//
// At a million rules the policy and the index (about 130 MB) far exceed the caches and
// the TLB: a decision costs two or three dependent reads of main memory (name slot,
// then the name's bytes and the rule; or index, span and rule), which is where the
// time goes. The name filters spare the slot read of a name no rule has.
package policy
