// ReservationTable: ids, expiry order, remembered expired ids, and the
// front of a reservation taken and given back.

#include "allocator/reservation_table.h"

#include <vector>

#include "gtest/gtest.h"

namespace kvbroker {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1000);

TEST(ReservationTableTest, IdsAreSequentialAndFindable) {
  ReservationTable t(8);
  EXPECT_EQ(t.Add({1, 2}, kT0).id, "res-1");
  EXPECT_EQ(t.Add({5}, kT0).id, "res-2");
  ASSERT_NE(t.Find("res-1"), nullptr);
  EXPECT_EQ(t.Find("res-1")->blocks, (std::vector<BlockId>{1, 2}));
  EXPECT_EQ(t.Find("res-3"), nullptr);
  EXPECT_EQ(t.total_blocks(), 3);
}

TEST(ReservationTableTest, ExpiresInTimeOrderAndRemembersIds) {
  ReservationTable t(2);
  t.Add({1}, kT0 + absl::Seconds(3));  // res-1
  t.Add({2}, kT0 + absl::Seconds(1));  // res-2
  t.Add({3}, kT0 + absl::Seconds(2));  // res-3
  ASSERT_TRUE(t.next_expiry().has_value());
  EXPECT_EQ(*t.next_expiry(), kT0 + absl::Seconds(1));
  EXPECT_TRUE(t.TakeExpired(kT0).empty());
  std::vector<Reservation> due = t.TakeExpired(kT0 + absl::Seconds(2));
  ASSERT_EQ(due.size(), 2u);
  EXPECT_EQ(due[0].id, "res-2");
  EXPECT_EQ(due[1].id, "res-3");
  EXPECT_TRUE(t.WasExpired("res-2"));
  EXPECT_EQ(t.Find("res-2"), nullptr);
  // At most two expired ids are remembered: the oldest is forgotten.
  due = t.TakeExpired(kT0 + absl::Seconds(3));
  ASSERT_EQ(due.size(), 1u);
  EXPECT_FALSE(t.WasExpired("res-2"));
  EXPECT_TRUE(t.WasExpired("res-3"));
  EXPECT_TRUE(t.WasExpired("res-1"));
  EXPECT_FALSE(t.next_expiry().has_value());
}

TEST(ReservationTableTest, RemoveDropsTheExpiryEntry) {
  ReservationTable t(8);
  t.Add({4, 9}, kT0);
  Reservation r = t.Remove("res-1");
  EXPECT_EQ(r.blocks, (std::vector<BlockId>{4, 9}));
  EXPECT_FALSE(t.next_expiry().has_value());
  EXPECT_TRUE(t.TakeExpired(kT0 + absl::Hours(1)).empty());
  EXPECT_FALSE(t.WasExpired("res-1"));
}

TEST(ReservationTableTest, TakeFrontAndPutFrontRestoreTheBlocks) {
  ReservationTable t(8);
  t.Add({3, 4, 7, 8}, kT0);
  Reservation* r = t.Find("res-1");
  std::vector<BlockId> taken = ReservationTable::TakeFront(*r, 3);
  EXPECT_EQ(taken, (std::vector<BlockId>{3, 4, 7}));
  EXPECT_EQ(r->blocks, (std::vector<BlockId>{8}));
  EXPECT_EQ(t.total_blocks(), 1);
  ReservationTable::PutFront(*r, taken);
  EXPECT_EQ(r->blocks, (std::vector<BlockId>{3, 4, 7, 8}));
}

}  // namespace
}  // namespace kvbroker
