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
	"sync/atomic"
	"syscall"
	"time"

	amqpchannel "github.com/nudgeworks/nudge/channel/amqp"
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
	// relay makes the slot a chaosrelay process (binary is chaosrelay) instead of a worker.
	relay bool
	// park runs the worker's exactly-once projection with OnFailure park.
	park bool
	// exactVersion is the version of the worker's exactly-once projection (0: unversioned);
	// deploy changes it for the slot's next incarnations.
	exactVersion int
	// flipHold is how long the exactly-once projection's cut-over waits in its ActivateFunc
	// (chaosworker -flip-hold).
	flipHold time.Duration
	// buildLagTarget is the exactly-once projection's BuildLagTarget (chaosworker -build-lag-target).
	buildLagTarget time.Duration
	// partitions splits the exactly-once projection, in the version the worker runs
	// (chaosworker -partitions); each incarnation then holds leases under its own id
	// (<slot>.<incarnation>) as owner. deploy changes it with the version.
	partitions int
	// queueType is the kind of the worker's RabbitMQ queues (chaosworker -queue-type); "" is
	// the channel's default.
	queueType amqpchannel.QueueType
	// leaseTTL and leaseRenew replace the lease defaults with partitions (chaosworker
	// -lease-ttl, -lease-renew); zero keeps them.
	leaseTTL, leaseRenew time.Duration
	// projections are the projections the workers run (chaosworker -projections); "" for all.
	projections string
	// fleet adds that many fleet projections to the ones run (chaosworker -fleet), the first
	// fleetSplit of them partitioned (-fleet-partitioned).
	fleet, fleetSplit int
	// startup replaces chaosworker's -startup-timeout (how long it retries its first
	// connections) when set.
	startup time.Duration
}

// workerSlot is one of a scenario's worker processes, restarted under the same name after
// every kill; each incarnation logs to a file of its own and appends to a sink file of its own.
type workerSlot struct {
	name string
	set  workerSettings

	mu   sync.Mutex
	proc *workerProc
	runs int
	// problems are the exits the suite did not cause (a crash, an error exit) and the
	// incarnations that needed SIGKILL after the graceful stop's deadline.
	problems []string
}

// problem records what went wrong with an incarnation.
func (s *workerSlot) problem(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.problems = append(s.problems, fmt.Sprintf(format, args...))
}

// workerProc is one running incarnation.
type workerProc struct {
	cmd   *exec.Cmd
	ready chan struct{} // closed when the process printed "ready"
	done  chan struct{} // closed when the process has been waited for
	err   error         // Wait's result, set before done is closed
	id    string        // <slot>.<incarnation>, the name of its log (and its lease owner)
	// started is when the process was started.
	started time.Time
	// flipping is closed when the process printed "flip-hold" (it is inside the cut-over of
	// its exactly-once projection's version); inFlip is true from then until "flip-hold-end".
	flipping chan struct{}
	inFlip   atomic.Bool
	// signalled is set before the suite sends a signal: an exit without it is the process's own.
	signalled atomic.Bool
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
	args := []string{"-name", s.name, "-prefix", s.set.prefix}
	if !s.set.relay {
		args = append(args, "-sink", filepath.Join(s.set.sinkDir, id+".lines"), "-safety-net", s.set.safetyNet.String())
	}
	if s.set.park {
		args = append(args, "-park")
	}
	if s.set.exactVersion > 0 {
		args = append(args, "-exact-version", strconv.Itoa(s.set.exactVersion), "-flip-hold", s.set.flipHold.String(),
			"-build-lag-target", s.set.buildLagTarget.String())
	}
	if s.set.partitions > 1 {
		args = append(args, "-partitions", strconv.Itoa(s.set.partitions), "-owner", id)
		if s.set.leaseTTL > 0 {
			args = append(args, "-lease-ttl", s.set.leaseTTL.String(), "-lease-renew", s.set.leaseRenew.String())
		}
	}
	if s.set.projections != "" {
		args = append(args, "-projections", s.set.projections)
	}
	if s.set.fleet > 0 {
		args = append(args, "-fleet", strconv.Itoa(s.set.fleet), "-fleet-partitioned", strconv.Itoa(s.set.fleetSplit))
	}
	if s.set.queueType != "" {
		args = append(args, "-queue-type", string(s.set.queueType))
	}
	if s.set.startup > 0 {
		args = append(args, "-startup-timeout", s.set.startup.String())
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
	p := &workerProc{cmd: cmd, ready: make(chan struct{}), done: make(chan struct{}), id: id, flipping: make(chan struct{}), started: time.Now()}
	go func() {
		sc := bufio.NewScanner(stdout)
		ready, flipping := false, false
		for sc.Scan() {
			_, _ = fmt.Fprintf(logFile, "stdout: %s\n", sc.Text())
			switch sc.Text() {
			case "ready":
				if !ready {
					ready = true
					close(p.ready)
				}
			case "flip-hold":
				p.inFlip.Store(true)
				if !flipping {
					flipping = true
					close(p.flipping)
				}
			case "flip-hold-end":
				p.inFlip.Store(false)
			}
		}
		p.err = cmd.Wait()
		_ = logFile.Close()
		if !p.signalled.Load() {
			s.problem("%s exited by itself (%v); see %s.log", id, exitText(p.err), id)
		}
		close(p.done)
	}()
	s.proc = p
	return p, nil
}

// deploy makes the slot's next incarnations run version version of the exactly-once
// projection, split into partitions (0 or 1: unpartitioned): a rolling deploy replaces a
// worker by killing it and starting it again.
func (s *workerSlot) deploy(version, partitions int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.set.exactVersion, s.set.partitions = version, partitions
}

// current returns the running incarnation, nil if none.
func (s *workerSlot) current() *workerProc {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.proc
}

// waitReady waits until p printed "ready", exited, or ctx ended. A process that printed
// "ready" and exited since was ready: p.ready is closed before p.done, but a select over two
// closed channels picks either.
func (p *workerProc) waitReady(ctx context.Context) error {
	select {
	case <-p.ready:
		return nil
	case <-p.done:
		select {
		case <-p.ready:
			return nil
		default:
		}
		return fmt.Errorf("worker exited before it was ready: %w", p.err)
	case <-ctx.Done():
		p.dumpGoroutines()
		return fmt.Errorf("%w (its goroutines are in its log)", ctx.Err())
	}
}

// dumpGoroutines sends the process SIGQUIT, on which a Go program writes every goroutine's
// stack to its standard error (the process's log) and exits, and waits a little for it: what
// a worker that never got ready waits for.
func (p *workerProc) dumpGoroutines() {
	p.signalled.Store(true)
	if p.cmd.Process.Signal(syscall.SIGQUIT) != nil {
		return
	}
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
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
	p.signalled.Store(true)
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		return false
	}
	<-p.done
	return true
}

// alive reports whether the process runs and the suite has not signalled it: from the
// signal on it counts as gone, though it may take a moment to die (or, after SIGTERM, to stop).
func (p *workerProc) alive() bool {
	if p.signalled.Load() {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// exitText describes a Wait result.
func exitText(err error) string {
	if err == nil {
		return "exit status 0"
	}
	return err.Error()
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
	p.signalled.Store(true)
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		if p.err != nil {
			s.problem("%s failed at its graceful stop (%v); see %s.log", p.id, p.err, p.id)
		}
	case <-time.After(grace):
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
		<-p.done
		s.problem("%s hung at shutdown: still running %s after SIGTERM, killed; see %s.log", p.id, grace, p.id)
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
	ctx, cancel := context.WithTimeout(ctx, deadline(60*time.Second))
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

// problems returns an error naming every worker incarnation that exited by itself (not
// killed or stopped by the suite), failed its graceful stop or hung at shutdown.
func (p *pool) problems() error {
	var errs []error
	for _, s := range p.slots {
		s.mu.Lock()
		for _, msg := range s.problems {
			errs = append(errs, errors.New(msg))
		}
		s.mu.Unlock()
	}
	return errors.Join(errs...)
}

// restarts counts the incarnations started beyond the first of each worker.
func (p *pool) restarts() int {
	n := 0
	for _, s := range p.slots {
		s.mu.Lock()
		n += max(0, s.runs-1)
		s.mu.Unlock()
	}
	return n
}
