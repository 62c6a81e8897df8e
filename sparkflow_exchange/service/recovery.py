"""A restarted coordinator takes up what its predecessor kept in the state directory (``journal.py``).

Exchanges come back as they were last kept (a set-aside version with the overwrite that set it aside);
writes that were open are aborted (their producers' registrations were not kept); services get a full
heartbeatTimeout to register again; services lost before the restart are taken up without a second log line.
"""
from __future__ import annotations

import itertools
import logging

from ..kinds import ServiceState
from .exchange_book import ExchangeBook
from .exchanges import Exchange
from .journal import Journal
from .service_roster import ServiceRoster
from .writes import Writes

log = logging.getLogger(__name__)


async def restore(book: ExchangeBook, roster: ServiceRoster, writes: Writes, journal: Journal) -> int:
    """Take up the state ``journal`` holds; from now on keep it there. Returns the exchanges restored."""
    services = roster.services
    current = list(services.services.values())  # this process's own service, registered at start
    services.restore(journal.load_services())
    replaced = []
    for r in current:  # a predecessor at the same address is lost now: it was this process's predecessor
        replaced += services.register(r.service_id, r.host_id, r.tcp, r.unix, r.pid)
    for record in replaced:  # lost now: said once, here
        log.warning("%s is lost: %s", record.where(), record.lost_reason)
    book.lost.update(journal.load_lost())
    top_epoch = top_write = 0
    for record in journal.load_exchanges():
        ex = _read(book, record)
        if ex is None:
            continue
        top_epoch = max(top_epoch, ex.epoch)
        top_write = max([top_write, *_write_numbers(ex, book.previous.get(ex.name))])
    book.epochs = itertools.count(top_epoch + 1)
    book.writes = itertools.count(top_write + 1)
    book.journal = journal
    for ex in list(book.exchanges.values()):
        for write_id in sorted(ex.open_writes):
            await writes.abort(ex.name, ex.epoch, write_id, "the coordinator restarted while this write was open "
                               "(its producers' registrations are not kept); write it again")
    roster.forget_lost()
    lost = [r for r in services.services.values() if r.state == ServiceState.LOST]
    if lost:  # each was logged when it was lost; one line says how many are still listed
        log.info("%d lost exchange services from before the restart are listed until lostServiceRetention "
                 "(%g s) after their loss", len(lost), roster.lost_retention)
        await roster.services_lost(lost, announce=False)
    book.names_changed()
    return len(book.exchanges)


def _read(book: ExchangeBook, record: dict) -> Exchange | None:
    """One exchange record into the book (and the version its open overwrite set aside); None if unreadable."""
    try:
        ex = Exchange.from_record(record)
        if record.get("previous"):
            older = book.previous[ex.name] = Exchange.from_record(record["previous"])
            older.life.aside = True
    except (KeyError, ValueError, TypeError) as exc:
        log.error("state directory: exchange record %r cannot be read (%s): skipped", record.get("name"), exc)
        return None
    book.exchanges[ex.name] = ex
    book.lost.pop(ex.name, None)
    return ex


def _write_numbers(ex: Exchange, older: Exchange | None) -> list[int]:
    """The numbers of the write ids an exchange and its set-aside version name (``w<n>``)."""
    ids = [*ex.open_writes, *(p.write_id for v in (ex, older) if v is not None for p in v.producers.values())]
    return [int(w[1:]) for w in ids if w[1:].isdigit()]
