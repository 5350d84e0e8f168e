package bench

import (
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cpuStat is the machine's CPU time counters from /proc/stat (Linux), in
// clock ticks: the total, the time no task wanted (idle and I/O wait), and
// the steal, time the hypervisor gave to other guests while this one wanted
// to run.
type cpuStat struct {
	total, idle, steal int64
}

// clockTick is the unit of /proc/stat: USER_HZ, 100 on every Linux
// architecture Go runs on.
const clockTick = 10 * time.Millisecond

// readCPU reads cpuStat; ok is false where there is no /proc/stat.
func readCPU() (s cpuStat, ok bool) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return s, false
	}
	line, _, _ := strings.Cut(string(b), "\n")
	fields := strings.Fields(line)
	if len(fields) < 9 || fields[0] != "cpu" {
		return s, false
	}
	for i, f := range fields[1:] {
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return s, false
		}
		if i < 8 { // user … steal; guest time is counted in user already
			s.total += n
		}
		switch i {
		case 3, 4: // idle, iowait
			s.idle += n
		case 7:
			s.steal = n
		}
	}
	return s, true
}

// stealMeter measures the share of CPU time stolen by the host over a
// section: figures taken while it is high say more about the host than
// about the code.
type stealMeter struct {
	start cpuStat
	ok    bool
}

func startSteal() stealMeter {
	s, ok := readCPU()
	return stealMeter{s, ok}
}

// percent is the steal since start, in percent of all CPU time, and
// whether it could be read.
func (m stealMeter) percent() (float64, bool) {
	s, ok := readCPU()
	if !ok || !m.ok || s.total <= m.start.total {
		return 0, false
	}
	return 100 * float64(s.steal-m.start.steal) / float64(s.total-m.start.total), true
}

// cpuMeter measures the CPU time spent over a stretch of work: by the whole
// machine (PostgreSQL, this process and anything else running; steal
// excluded) and by this process alone (the relay or the baseline's Go code,
// pgx and River's client side).
type cpuMeter struct {
	machine cpuStat
	self    time.Duration
	ok      bool
}

func startCPU() cpuMeter {
	s, ok := readCPU()
	self, okSelf := selfCPU()
	return cpuMeter{s, self, ok && okSelf}
}

// spent is the CPU time used since start by the machine and by this
// process, and whether both could be read.
func (m cpuMeter) spent() (machine, self time.Duration, ok bool) {
	s, okM := readCPU()
	me, okS := selfCPU()
	if !m.ok || !okM || !okS {
		return 0, 0, false
	}
	busy := (s.total - s.idle - s.steal) - (m.machine.total - m.machine.idle - m.machine.steal)
	return time.Duration(busy) * clockTick, me - m.self, true
}

// selfCPU is the user and system CPU time this process has used.
func selfCPU() (time.Duration, bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}

// span is a timed stretch of work: its wall time and the CPU time it cost
// (see cpuMeter).
type span struct {
	wall, machine, self time.Duration
	cpuOK               bool
}

// stopwatch times a span from startSpan to end.
type stopwatch struct {
	began time.Time
	cpu   cpuMeter
}

func startSpan() stopwatch {
	return stopwatch{began: time.Now(), cpu: startCPU()}
}

// end is the span from w's start until now.
func (w stopwatch) end() span {
	machine, self, ok := w.cpu.spent()
	return span{wall: time.Since(w.began), machine: machine, self: self, cpuOK: ok}
}
