package proxybench

import (
	"os"
	"os/exec"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestParseVmRSS(t *testing.T) {
	tests := []struct {
		name    string
		status  string
		want    int64
		wantErr bool
	}{
		{"present", "Name:\tsquid\nVmPeak:\t 9000 kB\nVmRSS:\t    4321 kB\nThreads:\t1\n", 4321, false},
		{"kernel thread has none", "Name:\tkthreadd\nThreads:\t1\n", 0, true},
		{"unexpected unit", "VmRSS:\t 12 MB\n", 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseVmRSS([]byte(tt.status))
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Errorf("parseVmRSS = %d, %v; want %d, error %v", got, err, tt.want, tt.wantErr)
			}
		})
	}
}

func TestParentPID(t *testing.T) {
	tests := []struct {
		name string
		stat string
		want int
		ok   bool
	}{
		{"plain", "1234 (squid) S 77 1234 1234 0 -1", 77, true},
		{"name with spaces and parentheses", "99 (a) b (c)) R 5 99 99", 5, true},
		{"truncated", "99 (x) S", 0, false},
		{"garbage", "no parenthesis", 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := parentPID([]byte(tt.stat))
			if got != tt.want || ok != tt.ok {
				t.Errorf("parentPID(%q) = %d, %v; want %d, %v", tt.stat, got, ok, tt.want, tt.ok)
			}
		})
	}
}

func TestRSSOfThisProcess(t *testing.T) {
	tree := ProcessTree(os.Getpid())
	if len(tree) == 0 || tree[0] != os.Getpid() {
		t.Fatalf("ProcessTree(self) = %v, want it to start with %d", tree, os.Getpid())
	}
	rss, err := RSS([]int{os.Getpid()})
	if err != nil {
		t.Fatal(err)
	}
	if rss <= 0 {
		t.Errorf("RSS(self) = %d, want > 0", rss)
	}
	if _, err := RSS(nil); err == nil {
		t.Error("RSS(nil) succeeded, want an error")
	}
}

func TestCPUTicks(t *testing.T) {
	tests := []struct {
		name string
		stat string
		want int64
		ok   bool
	}{
		{"utime plus stime", "25012 (my proc) R 24932 24932 8509 0 -1 4194304 102 0 0 0 70 30 0 0 20 0 1 0", 100, true},
		{"with ended children", "25012 (my proc) R 24932 24932 8509 0 -1 4194304 102 0 0 0 70 30 5 7 20 0 1 0", 112, true},
		{"truncated", "25012 (cat) R 24932 24932", 0, false},
		{"no children's times", "1 (x) R 1 1 1 0 -1 0 0 0 0 0 70 30", 0, false},
		{"not numbers", "1 (x) R 1 1 1 0 -1 0 0 0 0 0 u s 0 0", 0, false},
		{"children's time not a number", "1 (x) R 1 1 1 0 -1 0 0 0 0 0 70 30 0 c", 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := cpuTicks([]byte(tt.stat))
			if ok != tt.ok || (ok && got != tt.want) {
				t.Errorf("cpuTicks(%q) = %d, %v; want %d, %v", tt.stat, got, ok, tt.want, tt.ok)
			}
		})
	}
	if _, err := CPUTime([]int{os.Getpid()}); err != nil {
		t.Errorf("CPUTime(self): %v", err)
	}
}

func TestParseTimeWait(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int
		err  bool
	}{
		{"sockets: used 25\nTCP: inuse 1 orphan 0 tw 38678 alloc 1 mem 0\nUDP: inuse 0 mem 0\n", 38678, false},
		{"TCP: inuse 1 orphan 0 tw 0 alloc 1 mem 0\n", 0, false},
		{"TCP: inuse 1 orphan 0 alloc 1 mem 0\n", 0, true},
		{"TCP: inuse 1 orphan 0 tw many alloc 1\n", 0, true},
		{"sockets: used 25\n", 0, true},
	} {
		got, err := parseTimeWait([]byte(tc.in))
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("parseTimeWait(%q) = %d, %v; want %d, error %v", tc.in, got, err, tc.want, tc.err)
		}
	}
}

// The CPU of a child that ended stays in its parent's figure: a shell's subshell spins
// until it has used 0.5 s of CPU and exits, then the shell execs sleep (exec keeps the
// children's times).
func TestCPUTimeKeepsEndedChildren(t *testing.T) {
	const burn = 50 // clock ticks of the subshell's own CPU
	script := `( while :; do read -r _ _ _ _ _ _ _ _ _ _ _ _ _ u s _ < /proc/self/stat; [ $((u+s)) -ge ` +
		strconv.Itoa(burn) + ` ] && exit 0; done ); exec sleep 60`
	cmd := exec.Command("/bin/sh", "-c", script)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		cmd.Wait()
	}()
	// The shell execs sleep once the subshell has ended and been waited for.
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(20 * time.Millisecond) {
		if comm, _ := os.ReadFile("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/comm"); string(comm) == "sleep\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the subshell did not finish")
		}
	}
	tree := ProcessTree(cmd.Process.Pid)
	if !slices.Equal(tree, []int{cmd.Process.Pid}) {
		t.Fatalf("tree %v, want the shell alone", tree)
	}
	got, err := CPUTime(tree)
	if err != nil {
		t.Fatal(err)
	}
	if want := burn * time.Second / clockTicks; got < want {
		t.Errorf("CPUTime = %v after a child used %v and ended, want at least that", got, want)
	}
}

// clockTicks is a constant; the kernel tells every process its real value (USER_HZ) in
// the AT_CLKTCK entry of the auxiliary vector, which is where sysconf(_SC_CLK_TCK) reads
// it. A machine where the two differ would scale every CPU figure wrongly.
func TestClockTicksIsUserHZ(t *testing.T) {
	const atClkTck = 17 // AT_CLKTCK in <elf.h>
	auxv, err := unix.Auxv()
	if err != nil {
		t.Fatalf("auxiliary vector: %v", err)
	}
	for _, kv := range auxv {
		if kv[0] == atClkTck {
			if kv[1] != clockTicks {
				t.Errorf("AT_CLKTCK = %d, clockTicks = %d", kv[1], clockTicks)
			}
			return
		}
	}
	t.Fatal("no AT_CLKTCK in the auxiliary vector")
}
