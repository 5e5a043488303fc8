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
// jobs (load average 2.5-3.3 during the run), Go 1.26, best of 3. The policy is an
// allowlist of mixed rules: 30% exact hosts, 15% wildcards, 30% IPv4 and 25% IPv6
// (each half addresses, half CIDRs), a fifth with a port; the benchmark decides 4096
// destinations in turn, 80% of them hitting a rule of one kind or another. cpu-ns/op
// is the process's CPU time per decision. "matcher B/rule" is the compiled structures'
// heap after GC; the policy itself takes another 66 B/rule. The linear reference ran
// in the same run.
//
//	rules  ns/op  cpu-ns/op  allocs/op  compile (wall / CPU)  matcher B/rule  linear ns/op
//	10        68         67          0     0.02 / 0.02 ms               137  116 (1.7x)
//	1k       104        102          0     0.26 / 0.26 ms                70  9482 (91x)
//	100k     177        162          0       43 / 34 ms                  50  -
//	1M       276        253          0      449 / 443 ms                 64  -
//
// Other runs during the session, of this revision and earlier ones, measured the 1M case
// between about 180 and 400 ns per decision as the machine's neighbours came and went.
// At a million rules the policy and
// the index (about 130 MB) far exceed the caches and the TLB: a decision costs its
// three or four dependent reads of main memory (name slot, then the name's bytes and
// the rule; or index, span and rule), which is where the time goes.
package policy
