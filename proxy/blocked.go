package proxy

import (
	"sort"
	"sync"
)

// BlockedSummary counts the blocked attempts of one policy generation. It mirrors the
// controller's type of the same name (the JSON is the contract between the two).
type BlockedSummary struct {
	Generation uint64          `json:"generation"`
	Total      uint64          `json:"total"`
	Top        []BlockedTarget `json:"top"`
}

// BlockedTarget is one blocked destination and how often it was tried.
type BlockedTarget struct {
	Host   string `json:"host"`
	Port   uint16 `json:"port"`
	Type   string `json:"type"`
	Reason string `json:"reason"`
	Count  uint64 `json:"count"`
}

const (
	blockedCapacity = 1024 // distinct destinations remembered per generation
	blockedTop      = 50   // destinations reported
)

type blockedKey struct {
	host   string
	port   uint16
	typ    string
	reason string
}

// blockedCounter counts refusals per destination in bounded memory: when full, the
// least-tried destination makes room (its count still adds to the total).
type blockedCounter struct {
	mu     sync.Mutex
	total  uint64
	counts map[blockedKey]uint64
}

func newBlockedCounter() *blockedCounter {
	return &blockedCounter{counts: make(map[blockedKey]uint64)}
}

func (b *blockedCounter) add(host string, port uint16, typ, reason string) {
	if len(host) > 255 {
		host = host[:255]
	}
	k := blockedKey{host, port, typ, reason}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.total++
	if _, ok := b.counts[k]; !ok && len(b.counts) >= blockedCapacity {
		var victim blockedKey
		least := ^uint64(0)
		for key, n := range b.counts {
			if n < least {
				victim, least = key, n
			}
		}
		delete(b.counts, victim)
	}
	b.counts[k]++
}

func (b *blockedCounter) summary(generation uint64) BlockedSummary {
	b.mu.Lock()
	s := BlockedSummary{Generation: generation, Total: b.total, Top: make([]BlockedTarget, 0, min(len(b.counts), blockedTop))}
	all := make([]BlockedTarget, 0, len(b.counts))
	for k, n := range b.counts {
		all = append(all, BlockedTarget{Host: k.host, Port: k.port, Type: k.typ, Reason: k.reason, Count: n})
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
		return all[i].Type < all[j].Type
	})
	s.Top = append(s.Top, all[:min(len(all), blockedTop)]...)
	return s
}
