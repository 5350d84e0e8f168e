// Package pgtest starts throwaway PostgreSQL clusters from the server binaries
// installed on the machine. The quickstart example and the test harness both
// use it, so "a throwaway PostgreSQL" means the same thing everywhere.
//
// It never uses the network beyond the loopback interface and never downloads
// anything: it needs initdb and postgres on PATH or under
// /usr/lib/postgresql/*/bin (Debian's postgresql package).
package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ErrNoBinaries is returned by Start when no PostgreSQL server binaries can be
// found.
var ErrNoBinaries = errors.New("pgtest: no PostgreSQL server binaries (initdb, postgres) on PATH or under /usr/lib/postgresql/*/bin; install them (Debian: apt-get install postgresql) or set TEST_DATABASE_URL")

// Cluster is a running throwaway PostgreSQL cluster. It lives in a temporary
// directory that Close removes.
type Cluster struct {
	durable bool
	binDir  string
	dir     string
	dataDir string
	sockDir string
	port    int
	cred    *syscall.Credential

	mu      sync.Mutex
	cmd     *exec.Cmd
	exited  <-chan struct{}
	logFile *os.File
}

// FindBinDir returns the directory that holds initdb and postgres: PATH first,
// then the newest /usr/lib/postgresql/*/bin.
func FindBinDir() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		// A symlink on PATH (/usr/local/bin/initdb) names the directory
		// of the real binaries, where pg_basebackup lives too.
		if real, err := filepath.EvalSymlinks(p); err == nil {
			p = real
		}
		dir := filepath.Dir(p)
		if _, err := os.Stat(filepath.Join(dir, "postgres")); err == nil {
			return dir, nil
		}
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	sort.Slice(matches, func(i, j int) bool { return versionOf(matches[i]) > versionOf(matches[j]) })
	for _, m := range matches {
		dir := filepath.Dir(m)
		if _, err := os.Stat(filepath.Join(dir, "postgres")); err == nil {
			return dir, nil
		}
	}
	return "", ErrNoBinaries
}

func versionOf(initdbPath string) float64 {
	// /usr/lib/postgresql/<version>/bin/initdb
	v, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(filepath.Dir(initdbPath))), 64)
	return v
}

// Start initialises a cluster in a new temporary directory and starts it on a
// free loopback port, with durability switched off (this data is thrown away).
// When the process runs as root, initdb and postgres run as the "postgres"
// user, because PostgreSQL refuses to run as root.
func Start(ctx context.Context) (*Cluster, error) {
	return start(ctx, false)
}

// StartDurable is Start with production durability: fsync,
// synchronous_commit and full_page_writes on, so that commits wait for their
// WAL flush as they do in production (the benchmark of the write path needs
// it: what serialises notifying commits happens during that flush).
func StartDurable(ctx context.Context) (*Cluster, error) {
	return start(ctx, true)
}

func start(ctx context.Context, durable bool) (*Cluster, error) {
	binDir, err := FindBinDir()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "standmeet-events-pg-")
	if err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	c := &Cluster{
		durable: durable,
		binDir:  binDir,
		dir:     dir,
		dataDir: filepath.Join(dir, "data"),
		sockDir: filepath.Join(dir, "sock"),
	}
	if err := c.init(ctx); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if err := c.startOnFreePort(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// startOnFreePort starts the server on a free port. A port picked as free
// can be taken before postgres binds it: it tries a few.
func (c *Cluster) startOnFreePort(ctx context.Context) error {
	for attempt := 0; ; attempt++ {
		port, err := freePort()
		if err != nil {
			return err
		}
		c.port = port
		if err = c.Start(ctx); err == nil || attempt == 4 || ctx.Err() != nil {
			return err
		}
	}
}

func (c *Cluster) init(ctx context.Context) error {
	cred, err := serverCredential("PostgreSQL")
	if err != nil {
		return err
	}
	c.cred = cred
	if err := c.makeDirs(); err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, filepath.Join(c.binDir, "initdb"),
		"-D", c.dataDir, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("pgtest: initdb: %w\n%s", err, out)
	}
	return nil
}

// makeDirs makes the socket directory, and gives it and the cluster's
// directory to the user the server runs as.
func (c *Cluster) makeDirs() error {
	if err := os.MkdirAll(c.sockDir, 0o700); err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	return chown(c.cred, c.dir, c.sockDir)
}

// Start starts the server (again) on its data directory and port and waits
// until it accepts connections. Together with Stop it lets tests restart the
// database under a running application.
func (c *Cluster) Start(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd != nil {
		return errors.New("pgtest: cluster already running")
	}
	logFile, err := os.OpenFile(filepath.Join(c.dir, "postgres.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	cmd := exec.Command(filepath.Join(c.binDir, "postgres"), c.serverArgs()...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	exited, err := startServer(cmd, c.cred)
	if err != nil {
		logFile.Close()
		return fmt.Errorf("pgtest: starting postgres: %w", err)
	}
	c.cmd, c.exited, c.logFile = cmd, exited, logFile

	err = awaitConnections(ctx, c.URL("postgres"), exited, 60*time.Second)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, errExited):
		c.cmd = nil
		logFile.Close()
		return fmt.Errorf("pgtest: postgres exited at start-up; log:\n%s", c.logTail())
	case ctx.Err() != nil:
		c.stopLocked()
		return ctx.Err()
	}
	c.stopLocked()
	return fmt.Errorf("pgtest: postgres did not accept connections within 60s: %w; log:\n%s", err, c.logTail())
}

// serverArgs are postgres's arguments: the cluster's directories and port,
// and, unless durable, no durability.
func (c *Cluster) serverArgs() []string {
	args := []string{
		"-D", c.dataDir,
		"-p", strconv.Itoa(c.port),
		"-k", c.sockDir,
		"-c", "listen_addresses=127.0.0.1",
		"-c", "max_connections=500",
		"-c", "shared_buffers=256MB",
		"-c", "max_wal_size=2GB",
	}
	if !c.durable {
		args = append(args, "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off")
	}
	return args
}

// Stop shuts the server down (fast mode: open connections are terminated, as
// in a real restart) and waits for it to exit. Stopping a stopped cluster does
// nothing.
func (c *Cluster) Stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stopLocked()
}

func (c *Cluster) stopLocked() { c.shutDownLocked(syscall.SIGINT) }

// shutDownLocked sends sig to the server (SIGINT: a fast shutdown; SIGQUIT:
// an immediate one) and waits for it to exit, killing it after 30 s.
func (c *Cluster) shutDownLocked(sig os.Signal) {
	if c.cmd == nil {
		return
	}
	stopServer(c.cmd, c.exited, sig, 30*time.Second)
	c.logFile.Close()
	c.cmd = nil
}

// Close stops the server and removes its directory.
func (c *Cluster) Close() {
	c.Stop()
	os.RemoveAll(c.dir)
}

// URL returns a connection URL for the named database, as the postgres
// superuser over TCP on the loopback interface.
func (c *Cluster) URL(database string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", c.port, database)
}

func (c *Cluster) logTail() string {
	b, _ := os.ReadFile(filepath.Join(c.dir, "postgres.log"))
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > 20 {
		lines = lines[len(lines)-20:]
	}
	return strings.Join(lines, "\n")
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgtest: finding a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// FromEnv returns the URL in the environment variable env when it is set;
// otherwise it starts a throwaway cluster and returns a URL to its postgres
// database, with a function that removes the cluster. The example programs
// and the benchmark use it.
func FromEnv(ctx context.Context, env string) (url string, cleanup func(), err error) {
	if url := os.Getenv(env); url != "" {
		return url, func() {}, nil
	}
	fmt.Printf("%s is not set: starting a throwaway PostgreSQL …\n", env)
	c, err := Start(ctx)
	if err != nil {
		return "", nil, err
	}
	return c.URL("postgres"), c.Close, nil
}

// WithDatabase returns dbURL (a URL or a keyword=value string) pointing at
// another database.
func WithDatabase(dbURL, database string) string {
	u, err := url.Parse(dbURL)
	if err != nil || u.Scheme == "" {
		return strings.TrimSpace(dbURL) + " dbname=" + database
	}
	u.Path = "/" + database
	return u.String()
}
