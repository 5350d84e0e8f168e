package pgtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// Standby makes a streaming standby of c (pg_basebackup from the running
// server, connected back to it for replication), starts it on a port of its
// own, and makes c wait for it on every commit (synchronous replication:
// synchronous_standby_names = '*'), so a transaction whose COMMIT returned
// exists on the standby too. Close it like any cluster.
func (c *Cluster) Standby(ctx context.Context) (*Cluster, error) {
	dir, err := os.MkdirTemp("", "standmeet-events-pg-standby-")
	if err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	s := &Cluster{
		durable: c.durable,
		binDir:  c.binDir,
		dir:     dir,
		dataDir: filepath.Join(dir, "data"),
		sockDir: filepath.Join(dir, "sock"),
		cred:    c.cred,
	}
	if err := s.makeDirs(); err != nil {
		return nil, err
	}
	// -R writes standby.signal and primary_conninfo; -X stream brings the
	// WAL written during the copy along.
	cmd := exec.CommandContext(ctx, filepath.Join(c.binDir, "pg_basebackup"),
		"-D", s.dataDir, "-h", "127.0.0.1", "-p", strconv.Itoa(c.port), "-U", "postgres",
		"-R", "-X", "stream", "--checkpoint=fast", "--no-sync")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	if out, err := cmd.CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("pgtest: pg_basebackup: %w\n%s", err, out)
	}
	if err := s.startOnFreePort(ctx); err != nil {
		s.Close()
		return nil, err
	}
	if err := c.exec(ctx, "ALTER SYSTEM SET synchronous_standby_names = '*'", "SELECT pg_reload_conf()"); err != nil {
		s.Close()
		return nil, err
	}
	if err := c.awaitSyncStandby(ctx); err != nil {
		s.Close()
		return nil, fmt.Errorf("pgtest: the standby never became synchronous (%w); log:\n%s", err, s.logTail())
	}
	return s, nil
}

// awaitSyncStandby waits, up to a minute, until c counts a standby as its
// synchronous one.
func (c *Cluster) awaitSyncStandby(ctx context.Context) error {
	deadline := time.Now().Add(60 * time.Second)
	for {
		var sync bool
		conn, err := pgx.Connect(ctx, c.URL("postgres"))
		if err == nil {
			err = conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_stat_replication WHERE sync_state = 'sync' AND state = 'streaming')").Scan(&sync)
			conn.Close(ctx)
		}
		if err == nil && sync {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			if err == nil {
				err = errors.New("pg_stat_replication shows no synchronous standby")
			}
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Promote turns a standby into a primary and waits until it accepts writes.
func (c *Cluster) Promote(ctx context.Context) error {
	return c.exec(ctx, "SELECT pg_promote(true, 60)")
}

// Crash stops the server at once, as a power loss or a killed machine would:
// immediate shutdown (SIGQUIT), no checkpoint, connections cut.
func (c *Cluster) Crash() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.shutDownLocked(syscall.SIGQUIT)
}

// Port is the server's TCP port on 127.0.0.1.
func (c *Cluster) Port() int { return c.port }

func (c *Cluster) exec(ctx context.Context, sqls ...string) error {
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	defer conn.Close(ctx)
	for _, sql := range sqls {
		if _, err := conn.Exec(ctx, sql); err != nil {
			return fmt.Errorf("pgtest: %s: %w", sql, err)
		}
	}
	return nil
}
