package proxybench

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"syscall"
	"time"
)

// Process is a proxy the benchmark started and must stop.
type Process struct {
	Name string
	Addr string // the proxy's listen host:port
	Log  string // file holding its stdout and stderr
	cmd  *exec.Cmd
	done chan struct{}
}

// FreePort returns a loopback address with a port that was free a moment ago.
func FreePort() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("proxybench: free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// StartProcess runs argv with its output in dir/<name>.log and waits until addr accepts
// connections.
func StartProcess(name, dir, addr string, wait time.Duration, argv ...string) (*Process, error) {
	return startProcess(Target{}, name, dir, addr, wait, argv...)
}

// startProcess is StartProcess, waiting until addr accepts connections made from
// client's namespace (client.Enter).
func startProcess(client Target, name, dir, addr string, wait time.Duration, argv ...string) (*Process, error) {
	logPath := filepath.Join(dir, name+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("proxybench: %s: %w", name, err)
	}
	bin, err := exec.LookPath(argv[0])
	if err == nil {
		// The command runs in dir, so a path relative to here must become absolute.
		bin, err = filepath.Abs(bin)
	}
	if err != nil {
		logFile.Close()
		return nil, fmt.Errorf("proxybench: %s: %w", name, err)
	}
	cmd := exec.Command(bin, argv[1:]...)
	cmd.Dir = dir
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	// Its own process group, so a terminal's ^C reaches the benchmark, which stops it;
	// and SIGTERM if the benchmark dies without stopping it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	p := &Process{Name: name, Addr: addr, Log: logPath, cmd: cmd, done: make(chan struct{})}
	err = startLocked(cmd, p.done)
	logFile.Close()
	if err != nil {
		return nil, fmt.Errorf("proxybench: %s: %w", name, err)
	}
	deadline := time.Now().Add(wait)
	for {
		var c net.Conn
		err := client.run(func() (err error) {
			c, err = net.DialTimeout("tcp", addr, time.Second)
			return err
		})
		if err == nil {
			c.Close()
			return p, nil
		}
		select {
		case <-p.done:
			return nil, fmt.Errorf("proxybench: %s exited before listening (see %s): %s", name, logPath, tail(logPath))
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			p.Stop()
			return nil, fmt.Errorf("proxybench: %s not listening on %s after %s (see %s)", name, addr, wait, logPath)
		}
	}
}

// startLocked starts cmd, waits for it and then closes done, on a goroutine locked to
// its thread all along. The kernel sends Pdeathsig when the thread that forked the child
// exits, not the process (go.dev/issue/27505); the benchmark discards the threads it
// moves into network namespaces, and one of them could otherwise be a proxy's parent.
func startLocked(cmd *exec.Cmd, done chan<- struct{}) error {
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		cmd.Wait()
		close(done)
	}()
	return <-started
}

// RaiseFileLimit lifts the soft limit on open files to the hard limit: the idle-tunnel
// test holds thousands of sockets on both ends.
func RaiseFileLimit() (uint64, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, fmt.Errorf("proxybench: getrlimit: %w", err)
	}
	lim.Cur = lim.Max
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, fmt.Errorf("proxybench: setrlimit: %w", err)
	}
	return lim.Cur, nil
}

// PID is the process id of the started command.
func (p *Process) PID() int { return p.cmd.Process.Pid }

// Stop asks the process to terminate, and kills its group if it has not after a few
// seconds.
func (p *Process) Stop() error {
	select {
	case <-p.done:
		return nil
	default:
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return nil
	case <-time.After(5 * time.Second):
	}
	err := syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
	if err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("proxybench: stop %s: %w", p.Name, err)
	}
	return nil
}

func tail(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	if len(data) > 2000 {
		data = data[len(data)-2000:]
	}
	return string(data)
}
