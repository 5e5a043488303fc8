// Package blocked counts a rule set's refusals per destination in bounded memory, for
// the admin API's GET /v1/blocked (adminapi.BlockedSummary).
package blocked

import (
	"container/heap"
	"sort"
	"strings"
	"sync"

	"github.com/compass-egress/compass-egress/adminapi"
)

const (
	Capacity = 1024 // distinct destinations remembered per generation
	Top      = 50   // destinations reported
)

// Key is one refused destination as the summary lists it: the host (as the decision
// line names it, already clipped), port, type of request, reason and, for a
// transparent connection, its protocol ("" for the others).
type Key struct {
	Host     string
	Port     uint16
	Type     string
	Reason   string
	Protocol string
}

type entry struct {
	key   Key
	count uint64
	over  uint64 // count's possible excess over the key's own tries
	index int    // in the heap
}

// Counter counts refusals per destination in bounded memory with the Space-Saving
// algorithm: when full, the least-counted entry makes room and the newcomer inherits
// its count plus one. Any destination tried more than total/Capacity times therefore stays in the table, however many other names a
// sandbox tries in between (with plain eviction, alternating each try with a fresh
// name kept a destination at count 1 and out of the report).
type Counter struct {
	mu    sync.Mutex
	total uint64
	byKey map[Key]*entry
	heap  entryHeap // least count first
}

// New is an empty counter.
func New() *Counter {
	return &Counter{byKey: make(map[Key]*entry)}
}

// Add counts one refusal of k.
func (b *Counter) Add(k Key) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.total++
	if e, ok := b.byKey[k]; ok {
		e.count++
		heap.Fix(&b.heap, e.index)
		return
	}
	// A new key keeps a copy of the host: the caller's is often a substring of a
	// request line of up to 68 KiB, which the table would otherwise keep alive.
	k.Host = strings.Clone(k.Host)
	if len(b.byKey) < Capacity {
		e := &entry{key: k, count: 1}
		b.byKey[k] = e
		heap.Push(&b.heap, e)
		return
	}
	e := b.heap[0]
	delete(b.byKey, e.key)
	e.key, e.over, e.count = k, e.count, e.count+1
	b.byKey[k] = e
	heap.Fix(&b.heap, 0)
}

// Summary is the count of all refusals and the Top most counted destinations, most
// counted first, ties broken by host, port, type, reason and protocol so that two
// reads of the same counts agree; generation is the rule set's.
func (b *Counter) Summary(generation uint64) adminapi.BlockedSummary {
	b.mu.Lock()
	s := adminapi.BlockedSummary{Generation: generation, Total: b.total, Top: make([]adminapi.BlockedTarget, 0, min(len(b.byKey), Top))}
	all := make([]adminapi.BlockedTarget, 0, len(b.byKey))
	for _, e := range b.byKey {
		all = append(all, adminapi.BlockedTarget{Host: e.key.Host, Port: e.key.Port, Type: e.key.Type, Reason: e.key.Reason, Protocol: e.key.Protocol, Count: e.count, Overcount: e.over})
	}
	b.mu.Unlock()
	sort.Slice(all, func(i, j int) bool {
		if all[i].Count != all[j].Count {
			return all[i].Count > all[j].Count
		}
		if all[i].Host != all[j].Host {
			return all[i].Host < all[j].Host
		}
		if all[i].Port != all[j].Port {
			return all[i].Port < all[j].Port
		}
		if all[i].Type != all[j].Type {
			return all[i].Type < all[j].Type
		}
		if all[i].Reason != all[j].Reason {
			return all[i].Reason < all[j].Reason
		}
		return all[i].Protocol < all[j].Protocol
	})
	s.Top = append(s.Top, all[:min(len(all), Top)]...)
	return s
}

// entryHeap is a min-heap of entries by count (container/heap).
type entryHeap []*entry

func (h entryHeap) Len() int           { return len(h) }
func (h entryHeap) Less(i, j int) bool { return h[i].count < h[j].count }
func (h entryHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *entryHeap) Push(x any) {
	e := x.(*entry)
	e.index = len(*h)
	*h = append(*h, e)
}
func (h *entryHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}
