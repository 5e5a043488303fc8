package proxybench

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// RSS sums the resident set size (VmRSS) of the processes, in bytes.
func RSS(pids []int) (int64, error) {
	if len(pids) == 0 {
		return 0, fmt.Errorf("rss: no process")
	}
	var total int64
	for _, pid := range pids {
		data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
		if err != nil {
			return 0, fmt.Errorf("rss: %w", err)
		}
		kb, err := parseVmRSS(data)
		if err != nil {
			return 0, fmt.Errorf("rss: pid %d: %w", pid, err)
		}
		total += kb * 1024
	}
	return total, nil
}

// loadAverage is the first field of /proc/loadavg (the 1-minute load), or "?".
func loadAverage() string {
	data, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(data)); err == nil && len(f) > 0 {
		return f[0]
	}
	return "?"
}

// timeWaitSockets is the number of TCP sockets in TIME_WAIT on this host.
func timeWaitSockets() (int, error) {
	data, err := os.ReadFile("/proc/net/sockstat")
	if err != nil {
		return 0, err
	}
	return parseTimeWait(data)
}

// parseTimeWait returns the tw field of the TCP line of /proc/net/sockstat.
func parseTimeWait(sockstat []byte) (int, error) {
	s := bufio.NewScanner(bytes.NewReader(sockstat))
	for s.Scan() {
		rest, ok := strings.CutPrefix(s.Text(), "TCP: ")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		for i := 0; i+1 < len(f); i += 2 {
			if f[i] == "tw" {
				return strconv.Atoi(f[i+1])
			}
		}
		return 0, fmt.Errorf("no tw field in %q", s.Text())
	}
	return 0, fmt.Errorf("no TCP line")
}

// parseVmRSS returns the VmRSS field of a /proc/<pid>/status file, in kB.
func parseVmRSS(status []byte) (int64, error) {
	s := bufio.NewScanner(bytes.NewReader(status))
	for s.Scan() {
		rest, ok := strings.CutPrefix(s.Text(), "VmRSS:")
		if !ok {
			continue
		}
		fields := strings.Fields(rest)
		if len(fields) != 2 || fields[1] != "kB" {
			return 0, fmt.Errorf("unexpected VmRSS line %q", s.Text())
		}
		return strconv.ParseInt(fields[0], 10, 64)
	}
	return 0, fmt.Errorf("no VmRSS line")
}

// ProcessTree returns pid and all its descendants, found through the parent field of
// /proc/<pid>/stat. Squid's kids (and tinyproxy's, if any) are part of its memory.
func ProcessTree(pid int) []int {
	children := map[int][]int{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		if parent, ok := parentPID(data); ok {
			children[parent] = append(children[parent], child)
		}
	}
	tree := []int{pid}
	for i := 0; i < len(tree); i++ {
		tree = append(tree, children[tree[i]]...)
	}
	return tree
}

// clockTicks is USER_HZ, the unit of the CPU times in /proc/<pid>/stat; it is 100 on
// every Linux architecture Go supports (TestClockTicksIsUserHZ checks it against the
// kernel's AT_CLKTCK).
const clockTicks = 100

// CPUTime sums the user and system CPU time the processes have used so far, with that of
// their children that have ended and been waited for: a proxy that serves with child
// processes (tinyproxy before 1.10 does) would otherwise lose the CPU of every child that
// ended during a measurement, and the difference of two readings could even go negative.
func CPUTime(pids []int) (time.Duration, error) {
	var total time.Duration
	for _, pid := range pids {
		data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
		if err != nil {
			return 0, fmt.Errorf("cpu time: %w", err)
		}
		ticks, ok := cpuTicks(data)
		if !ok {
			return 0, fmt.Errorf("cpu time: pid %d: unexpected stat %q", pid, data)
		}
		total += time.Duration(ticks) * time.Second / clockTicks
	}
	return total, nil
}

// cpuTicks returns utime+stime+cutime+cstime, the 14th to 17th fields of
// /proc/<pid>/stat (cutime and cstime: children that ended and were waited for).
func cpuTicks(stat []byte) (int64, bool) {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, false
	}
	// After the name: state is field 3, so utime (14) is index 11 and cstime (17) index 14.
	fields := strings.Fields(string(stat[i+1:]))
	if len(fields) < 15 {
		return 0, false
	}
	var sum int64
	for _, f := range fields[11:15] {
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return 0, false
		}
		sum += n
	}
	return sum, true
}

// parentPID extracts the fourth field of /proc/<pid>/stat. The second field, the command
// name in parentheses, may itself contain spaces and parentheses, so parsing starts
// after its last ')'.
func parentPID(stat []byte) (int, bool) {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, false
	}
	fields := strings.Fields(string(stat[i+1:]))
	if len(fields) < 2 {
		return 0, false
	}
	ppid, err := strconv.Atoi(fields[1])
	return ppid, err == nil
}
