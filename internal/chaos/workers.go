package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// workerSettings are what every worker process of a scenario shares.
type workerSettings struct {
	binary    string
	dbURL     string
	amqpURL   string
	prefix    string
	sinkDir   string
	logDir    string
	safetyNet time.Duration
	debug     bool
	park      bool
}

// workerSlot is one of a scenario's worker processes, restarted under the same name after
// every kill; each incarnation logs to a file of its own and appends to a sink file of its own.
type workerSlot struct {
	name string
	set  workerSettings

	mu   sync.Mutex
	proc *workerProc
	runs int
}

// workerProc is one running incarnation.
type workerProc struct {
	cmd   *exec.Cmd
	ready chan struct{} // closed when the process printed "ready"
	done  chan struct{} // closed when the process has been waited for
	err   error         // Wait's result, set before done is closed
}

// start starts a new incarnation of the slot (the previous one must have exited).
func (s *workerSlot) start() (*workerProc, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.runs++
	id := fmt.Sprintf("%s.%d", s.name, s.runs)
	logFile, err := os.OpenFile(filepath.Join(s.set.logDir, id+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	args := []string{"-name", s.name, "-prefix", s.set.prefix, "-sink", filepath.Join(s.set.sinkDir, id+".lines"),
		"-safety-net", s.set.safetyNet.String()}
	if s.set.park {
		args = append(args, "-park")
	}
	if s.set.debug {
		args = append(args, "-debug")
	}
	cmd := exec.Command(s.set.binary, args...)
	cmd.Env = append(os.Environ(), "CHAOS_DATABASE_URL="+s.set.dbURL, "CHAOS_AMQP_URL="+s.set.amqpURL)
	cmd.Stderr = logFile
	cmd.SysProcAttr = childAttr()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		_ = logFile.Close()
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		_ = logFile.Close()
		return nil, fmt.Errorf("start worker %s: %w", id, err)
	}
	p := &workerProc{cmd: cmd, ready: make(chan struct{}), done: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(stdout)
		ready := false
		for sc.Scan() {
			_, _ = fmt.Fprintf(logFile, "stdout: %s\n", sc.Text())
			if !ready && sc.Text() == "ready" {
				ready = true
				close(p.ready)
			}
		}
		p.err = cmd.Wait()
		_ = logFile.Close()
		close(p.done)
	}()
	s.proc = p
	return p, nil
}

// current returns the running incarnation, nil if none.
func (s *workerSlot) current() *workerProc {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.proc
}

// waitReady waits until p printed "ready", exited, or ctx ended.
func (p *workerProc) waitReady(ctx context.Context) error {
	select {
	case <-p.ready:
		return nil
	case <-p.done:
		return fmt.Errorf("worker exited before it was ready: %w", p.err)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// kill SIGKILLs the running incarnation and waits for it; it reports whether it killed a
// live process.
func (s *workerSlot) kill() bool {
	p := s.current()
	if p == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
	}
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		return false
	}
	<-p.done
	return true
}

// stop ends the running incarnation with SIGTERM, or SIGKILL after grace.
func (s *workerSlot) stop(grace time.Duration) {
	p := s.current()
	if p == nil {
		return
	}
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
		<-p.done
	}
}

// exited reports whether the running incarnation has exited, and how.
func (s *workerSlot) exited() (bool, error) {
	p := s.current()
	if p == nil {
		return true, nil
	}
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

// pool is a scenario's worker processes.
type pool struct {
	slots []*workerSlot
}

func newPool(set workerSettings, n int) *pool {
	p := &pool{}
	for i := range n {
		p.slots = append(p.slots, &workerSlot{name: "worker-" + strconv.Itoa(i+1), set: set})
	}
	return p
}

// startAll starts every worker and waits until all are ready.
func (p *pool) startAll(ctx context.Context) error {
	var procs []*workerProc
	for _, s := range p.slots {
		proc, err := s.start()
		if err != nil {
			return err
		}
		procs = append(procs, proc)
	}
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	for i, proc := range procs {
		if err := proc.waitReady(ctx); err != nil {
			return fmt.Errorf("%s: %w (see its log)", p.slots[i].name, err)
		}
	}
	return nil
}

// stopAll stops every worker, gracefully when it can.
func (p *pool) stopAll() {
	var wg sync.WaitGroup
	for _, s := range p.slots {
		wg.Go(func() { s.stop(10 * time.Second) })
	}
	wg.Wait()
}

// crashed returns an error naming a worker that exited on its own (not killed by the suite).
func (p *pool) crashed() error {
	var errs []error
	for _, s := range p.slots {
		if done, err := s.exited(); done && s.current() != nil {
			var exit *exec.ExitError
			if errors.As(err, &exit) && exit.ExitCode() == -1 {
				continue // killed by a signal: the suite did it
			}
			if err == nil {
				err = errors.New("exit status 0")
			}
			errs = append(errs, fmt.Errorf("%s exited by itself (%w); see its log", s.name, err))
		}
	}
	return errors.Join(errs...)
}
