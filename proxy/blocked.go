package proxy

import (
	"container/heap"
	"sort"
	"strings"
	"sync"

	"github.com/compass-egress/compass-egress/adminapi"
)

const (
	blockedCapacity = 1024 // distinct destinations remembered per generation
	blockedTop      = 50   // destinations reported
)

type blockedKey struct {
	host   string
	port   uint16
	typ    string
	reason string
	proto  string // a transparent connection's protocol; "" for the others
}

type blockedEntry struct {
	key   blockedKey
	count uint64
	over  uint64 // count's possible excess over the key's own tries
	index int    // in the heap
}

// blockedCounter counts refusals per destination in bounded memory with the
// Space-Saving algorithm: when full, the least-counted entry makes room and the
// newcomer inherits its count plus one. Any destination tried more than
// total/blockedCapacity times therefore stays in the table, however many other names a
// sandbox tries in between (with plain eviction, alternating each try with a fresh
// name kept a destination at count 1 and out of the report).
type blockedCounter struct {
	mu    sync.Mutex
	total uint64
	byKey map[blockedKey]*blockedEntry
	heap  blockedHeap // least count first
}

func newBlockedCounter() *blockedCounter {
	return &blockedCounter{byKey: make(map[blockedKey]*blockedEntry)}
}

func (b *blockedCounter) add(host string, port uint16, typ, reason, proto string) {
	k := blockedKey{clipHost(host), port, typ, reason, proto}
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
	k.host = strings.Clone(k.host)
	if len(b.byKey) < blockedCapacity {
		e := &blockedEntry{key: k, count: 1}
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

func (b *blockedCounter) summary(generation uint64) adminapi.BlockedSummary {
	b.mu.Lock()
	s := adminapi.BlockedSummary{Generation: generation, Total: b.total, Top: make([]adminapi.BlockedTarget, 0, min(len(b.byKey), blockedTop))}
	all := make([]adminapi.BlockedTarget, 0, len(b.byKey))
	for _, e := range b.byKey {
		all = append(all, adminapi.BlockedTarget{Host: e.key.host, Port: e.key.port, Type: e.key.typ, Reason: e.key.reason, Protocol: e.key.proto, Count: e.count, Overcount: e.over})
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
	s.Top = append(s.Top, all[:min(len(all), blockedTop)]...)
	return s
}

// blockedHeap is a min-heap of entries by count (container/heap).
type blockedHeap []*blockedEntry

func (h blockedHeap) Len() int           { return len(h) }
func (h blockedHeap) Less(i, j int) bool { return h[i].count < h[j].count }
func (h blockedHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *blockedHeap) Push(x any) {
	e := x.(*blockedEntry)
	e.index = len(*h)
	*h = append(*h, e)
}
func (h *blockedHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}
